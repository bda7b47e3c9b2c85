"""attngen.integrations on CUDA: the tiny Llama's logits with attn_implementation="attngen" against "sdpa" in bf16
(padding included), under torch.compile, in a CUDA graph; flex_attention and the module wrapper on the kernels."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import attngen
from attngen.integrations import AttentionModule

pytestmark = pytest.mark.requires_gpu
needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is not installed (pip install -e '.[hf]')")


def _tiny_llama():
    import transformers

    import attngen.integrations.hf as hf

    hf.register()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=512)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def _inputs():
    ids = torch.randint(0, 256, (2, 200), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    mask = torch.ones(2, 200, dtype=torch.long, device="cuda")
    mask[0, :37] = 0   # left padding
    mask[1, 150:] = 0  # right padding
    return ids, mask


def _logits(model, impl, ids, mask):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits.float()


@needs_transformers
def test_hf_bf16_logits_match_sdpa():
    model = _tiny_llama()
    ids, mask = _inputs()
    for m in (None, mask):
        keep = torch.ones_like(ids, dtype=torch.bool) if m is None else m.bool()
        want, got = _logits(model, "sdpa", ids, m), _logits(model, "attngen", ids, m)
        err, ref = (got - want)[keep].abs().max().item(), want[keep].abs().max().item()
        assert err <= 0.03 * ref, (err, ref)


@needs_transformers
def test_hf_compiled_and_cuda_graph():
    model = _tiny_llama()
    ids, mask = _inputs()
    want = _logits(model, "sdpa", ids, mask)
    model.set_attn_implementation("attngen")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    keep = mask.bool()
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits.float()
    assert (got - want)[keep].abs().max() <= 0.03 * want[keep].abs().max()

    static_ids, static_mask = ids.clone(), mask.clone()
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):  # warm-up: kernels built and loaded before capture
                model(input_ids=static_ids, attention_mask=static_mask)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = model(input_ids=static_ids, attention_mask=static_mask).logits
        new_mask = mask.clone()
        new_mask[1, :20] = 0
        static_mask.copy_(new_mask)  # a new padding pattern reaches the replay
        graph.replay()
        torch.cuda.synchronize()
    want = _logits(model, "sdpa", ids, new_mask)
    keep = new_mask.bool()
    assert (static_out.float() - want)[keep].abs().max() <= 0.03 * want[keep].abs().max()


def test_flex_and_module_on_cuda():
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    want = attngen.compile(mask_mod=causal, backend="reference")(q, k, v)
    from torch.nn.attention.flex_attention import create_block_mask  # a submodule: `import torch` leaves it out

    got = attngen.flex_attention(q, k, v, block_mask=create_block_mask(causal, None, None, 256, 256, device="cuda"))
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    mod = AttentionModule(mask_mod=causal)
    out = torch.compile(mod, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(out, want, atol=2e-2, rtol=2e-2)
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_segment_buffers_do_not_race_across_streams():
    """Calls on two streams each get their own segment buffer (attngen/integrations/_segments.py). With one buffer
    per device: (1) a call on stream b passing the tensor stream a's call just passed skipped its copy and read the
    buffer before a's copy (queued behind a sleep) had landed; (2) b's copy of another mask could land while a's
    long kernel was still reading the buffer. Each output must equal the same call run alone."""
    from attngen.integrations._segments import segment_attention

    g = torch.Generator("cuda").manual_seed(2)
    q, k, v = (torch.randn(1, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    seg0 = torch.zeros((1, 4096), dtype=torch.int32, device="cuda")  # all keys
    seg1, seg2 = (torch.full((1, 4096), -1, dtype=torch.int32, device="cuda") for _ in range(2))
    seg1[:, :2048] = 0   # the first half
    seg2[:, 3072:] = 0   # the last quarter
    want1, want2 = (segment_attention(q, k, v, s, form="keys") for s in (seg1, seg2))
    a, b = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (a, b):  # both streams' buffers made and holding seg0, kernels loaded
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            segment_attention(q, k, v, seg0, form="keys")
    torch.cuda.synchronize()
    with torch.cuda.stream(a):
        torch.cuda._sleep(100_000_000)  # a's copy and kernel wait behind this
        out_a = segment_attention(q, k, v, seg1, form="keys")
    with torch.cuda.stream(b):
        out_b1 = segment_attention(q, k, v, seg1, form="keys")  # (1): the same tensor as a's last call
    torch.cuda.synchronize()
    with torch.cuda.stream(a):
        out_a2 = segment_attention(q, k, v, seg1, form="keys")  # a long kernel (4096 x 4096, 32 heads) ...
    with torch.cuda.stream(b):
        out_b2 = segment_attention(q, k, v, seg2, form="keys")  # (2): ... while b copies another mask
    torch.cuda.synchronize()
    for got, want in ((out_a, want1), (out_b1, want1), (out_a2, want1), (out_b2, want2)):
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1e-2)
