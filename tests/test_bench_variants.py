"""The benchmark's anchor variants (benchmarks/bench_forward.py) build and trace on the CPU, and the
document anchors have the densities their definitions promise (the device rounds only time them)."""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import attngen  # noqa: E402
from attngen.mods import Variant  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_forward  # noqa: E402


@pytest.mark.parametrize("key", bench_forward.ANCHORS)
def test_anchor_variant_traces(key):
    score_mod, mask_mod = bench_forward.make_variant(key, 2048, 4, "cpu")
    attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
    assert attn.traced.has_mask == (mask_mod is not None)


def test_document_anchor_densities():
    dens = {}
    for key in ("document", "document_cuts", "document_aligned"):
        _, mask_mod = bench_forward.make_variant(key, 8192, 16, "cpu")
        dens[key] = attngen.reference.mask_density(Variant(None, mask_mod), 1, 1, 8192, 8192, device="cpu")
    # the anchor probe's 8 ids per position, sorted: 8 documents of ~1024 tokens, density ~1/8
    assert abs(dens["document"] - 0.125) < 0.005
    # 7 random cut points (seed 0): the uneven documents measured as "document" until 2026-11-29
    assert abs(dens["document_cuts"] - 0.219) < 0.001
    # documents of exactly S / 8 tokens on tile boundaries (not an anchor): density exactly 1/8
    assert dens["document_aligned"] == 0.125
    assert len(bench_forward.ANCHORS) == len(set(bench_forward.ANCHORS))


@pytest.mark.parametrize("key", bench_forward.ISSUE15)
def test_issue15_variant_traces(key):
    # issue 15 point 4's partial-tile set (--set issue15): plain functions as flex users write them
    score_mod, mask_mod = bench_forward.make_variant(key, 2048, 4, "cpu")
    attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
    assert attn.traced.has_mask == (mask_mod is not None)
    assert bench_forward.SETS["issue15"] == bench_forward.ISSUE15
