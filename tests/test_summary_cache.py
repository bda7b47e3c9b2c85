"""frontend._SummaryCache, the per-block summaries of captured tensors a kernel call passes: recomputed when a
tensor or a length changes, always for inference tensors, and never handed to the wrong call."""
from types import SimpleNamespace

import torch

from attngen.frontend import _SummaryCache

LIB = SimpleNamespace(block_q=64, block_k=64)


def _variant(log):
    """A stand-in for a CompiledAttention with one captured tensor `t` and one summary: its sum, and the lengths."""
    def compute(tensors, BQ, BK, QLEN, KVLEN, QOFF):
        log.append(int(QLEN))
        return float(tensors["t"].sum()), int(QLEN)

    return SimpleNamespace(facts=SimpleNamespace(summaries=(SimpleNamespace(compute=compute),),
                                                 captured=(SimpleNamespace(name="t"),)))


def test_summaries_are_reused_until_a_tensor_changes():
    log: list = []
    attn, cache, t = _variant(log), _SummaryCache(), torch.ones(4)
    assert cache.get(attn, [t], LIB, 8, 8, 0) == ((4.0, 8),)
    assert cache.get(attn, [t], LIB, 8, 8, 0) == ((4.0, 8),) and len(log) == 1
    t.add_(1)
    assert cache.get(attn, [t], LIB, 8, 8, 0) == ((8.0, 8),) and len(log) == 2


def test_inference_tensors_are_summarized_on_every_call():
    """They have no version counter (reading it raises), so an in-place change cannot be detected."""
    log: list = []
    attn, cache = _variant(log), _SummaryCache()
    with torch.inference_mode():
        t = torch.ones(4)
        assert cache.get(attn, [t], LIB, 8, 8, 0) == ((4.0, 8),)
        t.add_(1)
        assert cache.get(attn, [t], LIB, 8, 8, 0) == ((8.0, 8),)
    assert cache.get(attn, [t], LIB, 8, 8, 0) == ((8.0, 8),) and len(log) == 3


class _Interleave(int):
    """A length whose last reference dies when the cache replaces its key: its __del__ runs another call at that
    moment, deterministically standing in for a second thread running between the cache's stores."""

    def __del__(self):
        self.other()


def test_a_call_returns_its_own_summaries_when_another_stores_in_between():
    log: list = []
    attn, cache, t = _variant(log), _SummaryCache(), torch.ones(4)
    first = _Interleave(8)
    first.other = lambda: cache.get(attn, [t], LIB, 32, 32, 0)
    cache.get(attn, [t], LIB, first, 8, 0)
    del first  # now only the cached key holds it
    assert cache.get(attn, [t], LIB, 16, 16, 0) == ((4.0, 16),)  # not the (4.0, 32) stored while it ran
    assert log == [8, 16, 32]
