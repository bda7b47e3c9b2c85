"""The block maps of the masks researchers write (benchmarks/mask_zoo.py: the cookbook's, the NATTEN family,
local + global tokens, windows with prefixes, chunks, dilation) against brute force: sound for every mask,
equal to brute force for the families marked exact."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import attngen  # noqa: E402
from attngen import reference  # noqa: E402
from attngen.mods import MaskMod, Variant  # noqa: E402
from attngen.blockmap import EMPTY, FULL  # noqa: E402
from helpers import tile_classes  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import mask_zoo  # noqa: E402

L = 2048  # the sequence length the masks are built for (NATTEN clamps at its borders)
# (q_len, kv_len, BQ, BK, q_offset): square maps at the kernel's tile sizes, plus ragged, offset and
# rectangular ones
SHAPES = [(L, L, 128, 128, 0), (L, L, 64, 128, 0), (L, L, 128, 64, 0), (1000, L, 128, 128, 1000),
          (L - 5, L - 3, 128, 128, 0), (L, L, 192, 80, 0), (300, 700, 64, 64, 37)]


def _brute(mask_mod, q_len, kv_len, BQ, BK, q_offset):
    m = reference.dense_mask(Variant(mask_mod=mask_mod), 1, 1, q_len, kv_len, q_offset=q_offset)[0, 0]
    return tile_classes(m, BQ, BK)


@pytest.mark.parametrize("name", list(mask_zoo.ZOO))
def test_zoo_block_map_against_brute_force(name):
    _, exact = mask_zoo.ZOO[name]
    mask_mod = MaskMod(mask_zoo.make(name, L, small=True), name)
    attn = attngen.compile(mask_mod=mask_mod, backend="reference")
    for q_len, kv_len, BQ, BK, q_offset in SHAPES:
        got = attngen.block_map(attn, q_len, kv_len, (BQ, BK), q_offset=q_offset)
        want = _brute(mask_mod, q_len, kv_len, BQ, BK, q_offset)
        ctx = f"{name}: q_len={q_len} kv_len={kv_len} block=({BQ},{BK}) q_offset={q_offset}"
        bad_empty = (got == EMPTY) & (want != EMPTY)
        bad_full = (got == FULL) & (want != FULL)
        assert not bad_empty.any(), f"tile marked EMPTY has kept elements at {bad_empty.nonzero()[:5].tolist()} ({ctx})"
        assert not bad_full.any(), f"tile marked FULL has masked elements at {bad_full.nonzero()[:5].tolist()} ({ctx})"
        if exact:
            diff = got != want
            assert not diff.any(), (f"inexact at {diff.nonzero()[:5].tolist()}: got {got[diff][:5].tolist()} "
                                    f"want {want[diff][:5].tolist()} ({ctx})")


@pytest.mark.parametrize("name", list(mask_zoo.ZOO))
def test_zoo_masks_stay_within_the_analysis_budget(name):
    from attngen import predicates

    attn = attngen.compile(mask_mod=MaskMod(mask_zoo.make(name, 8192), name), backend="reference")
    assert not attn.predicates.notes, attn.predicates.notes
    assert 0 < attn.predicates.analysis_steps < predicates.WORK_BUDGET


def test_random_masks_of_up_to_12_atoms_stay_within_the_budget():
    import random

    import bench_analysis
    from attngen import predicates

    r = random.Random(1)
    for i in range(6):
        text, fn = bench_analysis.random_mask(r, 12)
        attn = attngen.compile(mask_mod=MaskMod(lambda b, h, q, kv, fn=fn: fn(q, kv), f"random{i}"), backend="reference")
        assert not attn.predicates.notes, f"{text}: {attn.predicates.notes}"
        assert attn.predicates.analysis_steps < predicates.WORK_BUDGET


class _Analysed:
    """What block_map and explain take as an already analysed variant: a traced variant and its predicates."""

    def __init__(self, traced, predicates):
        self.traced, self.predicates = traced, predicates


@pytest.mark.parametrize("name", list(mask_zoo.ZOO))
def test_over_budget_derivation_stays_sound(name, monkeypatch):
    """With a tiny budget the refinements stop early: the map may get coarser (more partial tiles), never
    wrong, and the predicates say so."""
    from attngen import predicates
    from attngen.trace import trace

    mask_mod = MaskMod(mask_zoo.make(name, L, small=True), name)
    monkeypatch.setattr(predicates, "WORK_BUDGET", 5)
    traced = trace(Variant(mask_mod=mask_mod))
    coarse = predicates.derive(traced)
    assert coarse.analysis_steps <= 5
    for q_len, kv_len, BQ, BK, q_offset in SHAPES[:4]:
        got = attngen.block_map(_Analysed(traced, coarse), q_len, kv_len, (BQ, BK), q_offset=q_offset)
        want = _brute(mask_mod, q_len, kv_len, BQ, BK, q_offset)
        assert not ((got == EMPTY) & (want != EMPTY)).any()
        assert not ((got == FULL) & (want != FULL)).any()


def test_over_budget_map_is_coarser_and_explain_says_so(monkeypatch):
    from attngen import predicates
    from attngen.trace import trace

    name = "local_global"
    mask_mod = MaskMod(mask_zoo.make(name, L, small=True), name)
    traced = trace(Variant(mask_mod=mask_mod))
    exact = predicates.derive(traced)
    monkeypatch.setattr(predicates, "WORK_BUDGET", 5)
    coarse = predicates.derive(traced)
    assert not exact.notes and coarse.notes and "budget" in coarse.notes[0]
    want = _brute(mask_mod, L, L, 128, 128, 0)
    assert (attngen.block_map(_Analysed(traced, exact), L, L, (128, 128)) == want).all()
    assert (attngen.block_map(_Analysed(traced, coarse), L, L, (128, 128)) != want).any()
    assert "budget" in attngen.explain(_Analysed(traced, coarse), q_len=L)
