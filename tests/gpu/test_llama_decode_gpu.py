"""Issue 12's acceptance loop (benchmarks/llama_decode.py) on the GPU: greedy decoding of a 2-layer Llama-shaped
model (random weights, bf16), batch 8, a 2048-token prompt, 256 new tokens, each decode step one CUDA graph
replayed, with attngen's with_kvcache (append + RoPE + decode kernel) and with SDPA. Teacher-forced over attngen's
tokens, SDPA rates each of them its best up to bf16 noise (ld.THRESHOLD logit stds); the replays advance the
graph's state in place (lengths, cache slots, records) and give the steps an eager loop gives.
"""
import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "benchmarks"))
import llama_decode as ld  # noqa: E402

pytestmark = pytest.mark.requires_gpu

CFG = ld.LlamaConfig(layers=2)  # the benchmark's model (hidden 2048, 32 / 8 heads of 64, vocab 32000), 2 layers
B, PROMPT, NEW = 8, 2048, 256
FINAL = PROMPT + NEW - 1  # cached positions after the loop


@functools.lru_cache(maxsize=None)
def _model_and_prompt():
    model = ld.Llama(CFG, PROMPT + NEW, "cuda", torch.bfloat16, seed=0)
    return model, ld.random_prompt(CFG.vocab, B, PROMPT, "cuda", seed=1)


def test_greedy_loop_in_cuda_graphs_agrees_with_sdpa():
    model, prompt = _model_and_prompt()
    runs, caches, agree = ld.compare(model, prompt, NEW)  # captures each loop's step with host syncs refused
    speed = {n: f"{B * (NEW - 1) / r.decode_s:.0f} tokens/s" for n, r in runs.items() if n != "sdpa_forced"}
    print(f"\n{speed}; {agree}")
    for name, run in runs.items():
        assert run.graphed, name
        assert ((run.tokens >= 0) & (run.tokens < CFG.vocab)).all(), f"{name}: a step not recorded"
        assert not run.std.isnan().any(), f"{name}: a step not recorded"
    for name, cache in caches.items():  # NEW - 1 replays: the lengths advanced by one each, keys appended there
        assert cache.seqlens.tolist() == [FINAL] * B, name
        for layer in range(CFG.layers):
            written = cache.k[layer][:, :, PROMPT:FINAL].abs().amax(dim=(1, 3))  # (B, NEW - 1)
            assert (written > 0).all(), f"{name} layer {layer}: a decode position not appended"
            assert not cache.k[layer][:, :, FINAL:].any(), f"{name} layer {layer}: written past the last position"
    assert agree.ok, f"teacher-forced disagreements beyond {agree.threshold} logit stds: {agree.worst}"


def test_graph_replays_give_the_eager_steps():
    """The first 16 steps of the graphed attngen loop, replayed teacher-forced eagerly (with_kvcache's checked
    path, every launch from Python): the same tokens up to noise, so the graph replays the whole step with its
    state advancing, not a frozen copy of the captured one."""
    model, prompt = _model_and_prompt()
    n = 16
    graphed = ld.generate(model, ld.AttngenCache(model, B, PROMPT + n), prompt, n, graph=True)
    eager = ld.generate(model, ld.AttngenCache(model, B, PROMPT + n), prompt, n, graph=False, forced=graphed.tokens)
    regret = eager.regret / eager.std
    assert ((eager.pred == graphed.tokens) | (regret <= ld.THRESHOLD)).all(), (eager.pred, graphed.tokens, regret)
    assert graphed.tokens.unique().numel() > n  # the steps differ: not one token repeated
