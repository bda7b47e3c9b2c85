"""The greedy loop of benchmarks/llama_decode.py at toy sizes on CPU (float32): attngen's with_kvcache (its
reference path: append, RoPE, attention at cache_seqlens) gives the tokens and logits of the SDPA loop, and the
caches hold the same rotated keys; the SDPA loop itself equals recomputing the whole sequence without a cache.
Two broken attngen backends (RoPE applied twice, appends one position late) are caught by the same comparison."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import llama_decode as ld  # noqa: E402

CFG = ld.LlamaConfig(vocab=128, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128)
B, PROMPT, NEW = 2, 12, 6
FINAL = PROMPT + NEW - 1  # cached positions after the loop: the last token is generated, never fed


def _model():
    return ld.Llama(CFG, PROMPT + NEW, "cpu", torch.float32, seed=0)


def _prompt():
    return ld.random_prompt(CFG.vocab, B, PROMPT, "cpu", seed=1)


def _differences(runs, caches) -> list:
    """What differs between the attngen loop and the SDPA loop (teacher-forced on attngen's tokens, so both read
    the same token sequence): tokens, logits, cached keys and values, lengths."""
    found = []
    ours, sdpa, forced = runs["attngen"], runs["sdpa"], runs["sdpa_forced"]
    if not torch.equal(ours.tokens, sdpa.tokens):
        found.append(f"tokens: attngen {ours.tokens.tolist()} vs sdpa {sdpa.tokens.tolist()}")
    err = (ours.logits - forced.logits).abs().max().item()
    if err > 1e-4:
        found.append(f"logits differ by up to {err:.3g}")
    a, s = caches["attngen"], caches["sdpa"]
    for layer in range(CFG.layers):
        for what, ca, cs in (("k", a.k[layer], s.k[layer]), ("v", a.v[layer], s.v[layer])):
            # layer 0 reads only the tokens' embeddings, so both loops cache the same bits there (RoPE formed the
            # same way, rounded once); deeper layers carry the two attentions' rounding
            same = (torch.equal(ca[:, :, :FINAL], cs[:, :, :FINAL]) if layer == 0
                    else torch.allclose(ca[:, :, :FINAL], cs[:, :, :FINAL], rtol=1e-4, atol=1e-5))
            if not same:
                found.append(f"layer {layer} {what} cache differs at positions < {FINAL}")
            if ca[:, :, FINAL:].any() or cs[:, :, FINAL:].any():
                found.append(f"layer {layer} {what} cache written at positions >= {FINAL}")
    for name, c in caches.items():
        if c.seqlens.tolist() != [FINAL] * B:
            found.append(f"{name} cache_seqlens {c.seqlens.tolist()}, want {[FINAL] * B}")
    return found


def test_attngen_loop_gives_the_sdpa_loops_tokens_and_cache():
    runs, caches, agree = ld.compare(_model(), _prompt(), NEW, keep_logits=True)
    assert not _differences(runs, caches)
    assert agree.ok and agree.equal == agree.steps == B * NEW and agree.first_divergence == [-1] * B
    assert agree.forced_disagree == 0
    # the comparison is not vacuous: the loop generated different tokens per sequence and step
    assert len(set(runs["attngen"].tokens.flatten().tolist())) > NEW


def test_cached_decode_equals_recomputing_the_whole_sequence():
    """The SDPA loop is the yardstick: step t's logits equal a cache-free causal pass over the prompt and the
    tokens fed before step t."""
    model, prompt = _model(), _prompt()
    run = ld.generate(model, ld.SdpaCache(model, B, PROMPT + NEW), prompt, NEW, keep_logits=True)
    for t in range(NEW):
        seq = torch.cat((prompt, run.tokens[:, :t]), dim=1)
        fresh = model.prefill(seq, ld.SdpaCache(model, B, PROMPT + NEW))
        assert torch.allclose(run.logits[:, t], fresh, rtol=1e-4, atol=1e-4), f"step {t}"


class _RopeTwice(ld.AttngenCache):
    """Rotates q and k itself and passes the tables as well."""

    def decode(self, layer, q, k, v):
        positions = self.seqlens.long().view(-1, 1)
        return super().decode(layer, self.rope(q, positions), self.rope(k, positions), v)


class _AppendsLate(ld.AttngenCache):
    """Says one more key is cached than there is: appends (and places the query) one position late."""

    def decode(self, layer, q, k, v):
        return self.attn.with_kvcache(q, self.k[layer], self.v[layer], k, v, cache_seqlens=self.seqlens + 1,
                                      rotary_cos=self.rope.cos, rotary_sin=self.rope.sin)


@pytest.mark.parametrize("broken", [_RopeTwice, _AppendsLate])
def test_the_comparison_catches_a_broken_backend(monkeypatch, broken):
    monkeypatch.setitem(ld.BACKENDS, "attngen", broken)
    runs, caches, _ = ld.compare(_model(), _prompt(), NEW, keep_logits=True)
    found = _differences(runs, caches)
    assert any("logits" in f for f in found) and any("layer 0 k cache" in f for f in found), found
