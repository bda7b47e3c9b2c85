"""attngen.integrations on CPU: torch's flex_attention signature, the nn.Module wrapper, the per-call segment op,
and (with transformers installed) attn_implementation="attngen" against transformers' own "sdpa" and "eager".

torch.compile runs with the "eager" / "aot_eager" backends: they check fullgraph tracing and, with aot_eager,
functionalization (what reorders mutations), without inductor's compile time."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention as torch_flex

import attngen
from attngen.errors import InputError
from attngen.integrations import AttentionModule
from attngen.integrations._segments import segment_attention

# torch's own flex is the reference here, run eagerly on purpose
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="transformers is not installed (an optional extra: pip install -e '.[hf]')")

B, HQ, HKV, L, D = 2, 4, 2, 24, 16
DOC = torch.tensor([0] * 10 + [1] * 9 + [2] * 5)


def rel_bias(score, b, h, q_idx, kv_idx):
    return score + 0.05 * (q_idx - kv_idx) * (h + 1)


def tanh_cap(score, b, h, q_idx, kv_idx):
    return 5.0 * torch.tanh(score / 5.0)


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def window6(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 6)


def document(b, h, q_idx, kv_idx):
    return DOC[q_idx] == DOC[kv_idx]


def _qkv(hkv=HQ, requires_grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, L, D, generator=g)
    k, v = (torch.randn(B, hkv, L, D, generator=g) for _ in range(2))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


# ----------------------------------------------------------------------------------------------------------
# flex_attention


@pytest.mark.parametrize("score_mod", [None, rel_bias, tanh_cap], ids=["none", "rel_bias", "tanh_cap"])
@pytest.mark.parametrize("mask_mod", [None, causal, window6, document], ids=["none", "causal", "window", "doc"])
def test_flex_matches_torch_flex(score_mod, mask_mod):
    q, k, v = _qkv()
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, L, L, device="cpu")
    want, aux = torch_flex(q, k, v, score_mod=score_mod, block_mask=block_mask, return_aux=AuxRequest(lse=True))
    want_lse = aux.lse
    got, lse = attngen.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse, want_lse, atol=2e-5, rtol=2e-5)


def test_flex_gqa_scale_and_aux():
    q, k, v = _qkv(hkv=HKV)
    bm = create_block_mask(causal, B, None, L, L, device="cpu", BLOCK_SIZE=8)  # block tensors differ: ignored
    want = torch_flex(q, k, v, score_mod=rel_bias, block_mask=bm, scale=0.3, enable_gqa=True)
    got = attngen.flex_attention(q, k, v, score_mod=rel_bias, block_mask=bm, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    out, aux = attngen.flex_attention(q, k, v, block_mask=bm, enable_gqa=True, return_aux=AuxRequest(lse=True))
    assert aux.lse.shape == (B, HQ, L) and aux.max_scores is None
    with pytest.raises(InputError, match="enable_gqa=True"):
        attngen.flex_attention(q, k, v)


def test_flex_caches_per_mod_identity():
    from attngen.integrations import _cache

    q, k, v = _qkv()
    attngen.flex_attention(q, k, v, score_mod=rel_bias)
    n = len(_cache.COMPILED)
    for _ in range(3):
        attngen.flex_attention(q, k, v, score_mod=rel_bias)
    assert len(_cache.COMPILED) == n


def test_flex_compiles_fullgraph_and_is_differentiable():
    q, k, v = _qkv(hkv=HKV, requires_grad=True)
    bm = create_block_mask(document, None, None, L, L, device="cpu")

    def f(q, k, v):
        return attngen.flex_attention(q, k, v, score_mod=rel_bias, block_mask=bm, enable_gqa=True)

    with torch.no_grad():
        plain = [t.detach() for t in (q, k, v)]
        torch.testing.assert_close(f(*plain), torch_flex(*plain, score_mod=rel_bias, block_mask=bm, enable_gqa=True),
                                   atol=2e-5, rtol=2e-5)
    # (torch's flex has no CPU backward: the gradients are checked against attngen's own, eager)
    want = attngen.compile(rel_bias, document)(q, k, v)
    want_grads = torch.autograd.grad(want.square().sum(), (q, k, v))
    for backend in ("eager", "aot_eager"):
        torch._dynamo.reset()
        got = torch.compile(f, fullgraph=True, backend=backend)(q, k, v)
        grads = torch.autograd.grad(got.square().sum(), (q, k, v))
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------------------------------------
# AttentionModule


def test_module_forward_backward_and_compile():
    mod = AttentionModule(score_mod=rel_bias, causal=True, scale=0.25)
    q, k, v = _qkv(hkv=HKV, requires_grad=True)
    want = attngen.compile(rel_bias, causal=True)(q, k, v, scale=0.25)
    got = mod(q, k, v)
    torch.testing.assert_close(got, want)
    dq, dk, dv = torch.autograd.grad(got.sum(), (q, k, v))
    assert dq.shape == q.shape and dk.shape == k.shape and torch.isfinite(dv).all()
    compiled = torch.compile(mod, fullgraph=True, backend="aot_eager")
    out, lse = compiled(q, k, v, return_lse=True)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), q)[0], dq)
    assert "causal" in repr(mod)


# ----------------------------------------------------------------------------------------------------------
# per-call segment tensors (the HF padding path)


SEGS = [torch.tensor([[-1] * 5 + [0] * 19, [0] * 7 + [1] * 12 + [-1] * 5]),
        torch.tensor([[0] * 24, [-1] * 3 + [0] * 4 + [1] * 17])]


def _segment_reference(q, k, v, seg, window=None, form="segments"):
    """The "segments" form under a causal mask (and window), or the "keys" form without one."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if form == "keys":
        keep = (seg[:, None, :] >= 0).expand(-1, q.shape[2], -1)
    else:
        i = torch.arange(q.shape[2])
        keep = (i[:, None] >= i[None, :]) if window is None else (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < window)
        keep = keep[None] & (seg[:, None, :] >= 0) & (seg[:, :, None] == seg[:, None, :])
    return (s.masked_fill(~keep[:, None], float("-inf")).softmax(-1).nan_to_num(0.0)) @ v


def test_segments_per_call_under_functionalization():
    """The values of each call reach the op, also under aot_eager (which moves mutations of captured tensors after
    their readers) and in the backward."""
    q, k, v = _qkv(hkv=HKV, requires_grad=True)

    def f(q, k, v, seg):
        return segment_attention(q, k, v, seg, window=9)

    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        for seg in SEGS:
            kept = (seg >= 0)[:, None, :, None].expand(B, HQ, L, D)
            want = _segment_reference(q, k, v, seg, window=9)
            got = fn(q, k, v, seg)
            torch.testing.assert_close(got[kept], want[kept], atol=2e-5, rtol=2e-5)
            g_want = torch.autograd.grad(want[kept].sum(), (q, k, v))
            g_got = torch.autograd.grad(got[kept].sum(), (q, k, v))
            for a, b in zip(g_got, g_want):
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def _check_segments(q, k, v, seg, form="segments", **options):
    got = segment_attention(q, k, v, seg, causal=form == "segments", form=form, **options)
    kept = (seg >= 0)[:, None, :, None].expand(B, HQ, L, D)
    torch.testing.assert_close(got[kept], _segment_reference(q, k, v, seg, form=form)[kept])


def test_segment_buffers_are_per_stream(monkeypatch):
    """One buffer per (device, stream): a call on one stream never writes the buffer a kernel queued on another
    may still read, and never skips its copy because another stream's call passed the same tensor (that copy may
    not have landed). CPU tensors have no streams, so the stream is faked; tests/gpu/test_integrations_gpu.py
    runs the race on two CUDA streams."""
    from attngen.integrations import _segments

    stream = ["A"]
    monkeypatch.setattr(_segments, "stream_key", lambda device: (device, stream[0]))
    q, k, v = _qkv(hkv=HKV)
    for stream[0], seg in (("A", SEGS[0]), ("B", SEGS[0]), ("A", SEGS[1])):
        _check_segments(q, k, v, seg)
    state = _segments._SEGMENTED[_segments.segmented_key(True, None, None, "segments")].state
    buf_a, buf_b = state[(torch.device("cpu"), "A")][0], state[(torch.device("cpu"), "B")][0]
    assert buf_a.data_ptr() != buf_b.data_ptr()
    assert torch.equal(buf_a[:, :L], SEGS[1].int()) and torch.equal(buf_b[:, :L], SEGS[0].int())


@pytest.mark.parametrize("form", ["segments", "keys"])
def test_segments_under_inference_mode(form):
    """Inference tensors have no version counter: they are always copied. A buffer made under inference_mode is
    a normal tensor, so a later call outside it (training after evaluation) can still copy into it."""
    window = 29 if form == "segments" else (29, 29)  # wider than L: no effect, but a variant no other test makes
    q, k, v = _qkv(hkv=HKV)
    with torch.inference_mode():
        seg = SEGS[0].to(torch.int32)  # an inference tensor, passed on as is
        _check_segments(q, k, v, seg, form, window=window)
        seg.copy_(SEGS[1])  # changed in place: no version counter says so
        _check_segments(q, k, v, seg, form, window=window)
    _check_segments(q, k, v, SEGS[0], form, window=window)


def test_import_loads_neither_transformers_nor_dynamo():
    code = ("import sys, attngen, attngen.integrations.hf, attngen.integrations.flex, attngen.integrations.module\n"
            "bad = [m for m in ('transformers', 'sympy', 'torch._dynamo') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------------------------------------
# Hugging Face transformers


def _tiny(model_cls_name, config_cls_name, **overrides):
    import transformers

    torch.manual_seed(0)
    kw = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, head_dim=16)
    kw.update(overrides)
    config = getattr(transformers, config_cls_name)(**kw)
    return getattr(transformers, model_cls_name)(config).eval()


def _logits(model, impl, ids, mask=None):
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def _masks():
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1))
    left = torch.ones(2, 16, dtype=torch.long)
    left[0, :5] = 0
    right = torch.ones(2, 16, dtype=torch.long)
    right[1, 11:] = 0
    return ids, {"none": None, "left": left, "right": right}


@pytest.fixture(scope="module")
def hf_registered():
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed (an optional extra: pip install -e '.[hf]')")
    import attngen.integrations.hf as hf

    return hf.register()


@needs_transformers
def test_hf_llama_matches_sdpa_and_eager(hf_registered):
    model = _tiny("LlamaForCausalLM", "LlamaConfig")
    ids, masks = _masks()
    for name, mask in masks.items():
        got = _logits(model, "attngen", ids, mask)
        keep = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
        for impl in ("sdpa", "eager"):
            torch.testing.assert_close(got[keep], _logits(model, impl, ids, mask)[keep], atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"{name} padding vs {impl}: {m}")


@needs_transformers
def test_hf_gemma2_sliding_window_and_softcap(hf_registered):
    model = _tiny("Gemma2ForCausalLM", "Gemma2Config", sliding_window=5, attn_logit_softcapping=2.0,
                  final_logit_softcapping=None, query_pre_attn_scalar=20, layer_types=["sliding_attention",
                                                                                     "full_attention"])
    ids, masks = _masks()
    for name, mask in masks.items():
        keep = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
        torch.testing.assert_close(_logits(model, "attngen", ids, mask)[keep],
                                   _logits(model, "eager", ids, mask)[keep], atol=1e-5, rtol=1e-5,
                                   msg=lambda m: f"{name} padding: {m}")


@needs_transformers
def test_hf_compiled_fullgraph_and_training(hf_registered):
    model = _tiny("LlamaForCausalLM", "LlamaConfig")
    ids, masks = _masks()
    mask = masks["left"]
    want = _logits(model, "sdpa", ids, mask)
    model.set_attn_implementation("attngen")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        got = compiled(input_ids=ids, attention_mask=mask).logits
        got_unpadded = compiled(input_ids=ids).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_unpadded, _logits(model, "sdpa", ids), atol=1e-5, rtol=1e-5)

    # gradients of the weights agree with eager attention
    grads = {}
    for impl in ("eager", "attngen"):
        model.zero_grad()
        model.set_attn_implementation(impl)
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits[mask.bool()].square().mean().backward()
        grads[impl] = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
    torch.testing.assert_close(grads["attngen"], grads["eager"], atol=1e-5, rtol=1e-4)


@needs_transformers
def test_hf_generate_with_left_padding(hf_registered):
    model = _tiny("LlamaForCausalLM", "LlamaConfig")
    ids, masks = _masks()
    tokens = {}
    for impl in ("sdpa", "attngen"):
        model.set_attn_implementation(impl)
        tokens[impl] = model.generate(input_ids=ids, attention_mask=masks["left"], max_new_tokens=4,
                                      do_sample=False, pad_token_id=0)
    assert torch.equal(tokens["attngen"], tokens["sdpa"])


@needs_transformers
def test_hf_unsupported_settings_raise(hf_registered):
    from attngen.integrations.hf import attention_forward

    model = _tiny("LlamaForCausalLM", "LlamaConfig")
    module = model.model.layers[0].self_attn
    q = torch.randn(1, 4, 6, 16)
    k = v = torch.randn(1, 2, 6, 16)
    with pytest.raises(InputError, match="4D attention_mask.*2D"):
        attention_forward(module, q, k, v, torch.zeros(1, 1, 6, 6))
    with pytest.raises(InputError, match="dropout"):
        attention_forward(module, q, k, v, None, dropout=0.1)
    with pytest.raises(InputError, match="s_aux"):
        attention_forward(module, q, k, v, None, s_aux=torch.zeros(4))
    out, weights = attention_forward(module, q, k, v, None, scaling=0.25)
    assert out.shape == (1, 6, 4, 16) and weights is None


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_hf_raw_int64_padding_mask_drops_padded_keys(causal):
    """The tokenizer's int64 0/1 mask reaching the attention function as is (no mask function) is a padding mask,
    not segment ids: without a causal mask too ("keys" form), every query must drop the padded keys."""
    from types import SimpleNamespace

    from attngen.integrations.hf import attention_forward

    q, k, v = _qkv(hkv=HKV)
    mask = torch.ones(B, L, dtype=torch.long)
    mask[0, :5] = 0    # left padding
    mask[1, 19:] = 0   # right padding
    seg = torch.where(mask.bool(), 0, -1)
    form = "segments" if causal else "keys"
    out, _ = attention_forward(SimpleNamespace(), q, k, v, mask, is_causal=causal)
    torch.testing.assert_close(out.transpose(1, 2), _segment_reference(q, k, v, seg, form=form))
    with pytest.raises(InputError, match="float32 attention_mask"):
        attention_forward(SimpleNamespace(), q, k, v, mask.float(), is_causal=causal)
