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


def test_document_anchor_with_the_probes_int64_ids():
    """document_i64 is the document anchor with its ids as the anchor probe makes them (torch.randint: int64), the
    same ids the "document" row converts to int32: the mask reads a tensor of each dtype, of equal values."""
    ids = {}
    for key in ("document", "document_i64"):
        _, mask_mod = bench_forward.make_variant(key, 8192, 16, "cpu")
        attn = attngen.compile(mask_mod=mask_mod)
        (captured,) = attn.facts.captured
        ids[key] = captured.tensor
    assert ids["document"].dtype == torch.int32 and ids["document_i64"].dtype == torch.int64
    assert torch.equal(ids["document"].long(), ids["document_i64"])
    assert bench_forward.LABELS["document_i64"] != bench_forward.LABELS["document"]


@pytest.mark.parametrize("key", bench_forward.ISSUE15)
def test_issue15_variant_traces(key):
    # issue 15 point 4's partial-tile set (--set issue15): plain functions as flex users write them
    score_mod, mask_mod = bench_forward.make_variant(key, 2048, 4, "cpu")
    attn = attngen.compile(score_mod=score_mod, mask_mod=mask_mod)
    assert attn.traced.has_mask == (mask_mod is not None)
    assert bench_forward.SETS["issue15"] == bench_forward.ISSUE15


def test_interleaved_rounds_rotate_the_order(monkeypatch):
    """Each round of interleaved_ms starts one implementation further on, so that over ROUNDS = 3 rounds attngen,
    flex and SDPA each take every place of a round once (a place of the round read slower on the power-capped H200);
    a failing implementation is dropped with its error, the others keep their rotation."""
    calls = []

    def fake_bench(fn):
        calls.append(fn())
        return {"attngen": 1.0, "flex": 2.0, "sdpa": 3.0}[calls[-1]]

    monkeypatch.setattr(bench_forward, "bench_ms", fake_bench)
    monkeypatch.setattr(bench_forward, "ROUNDS", 3)
    row = {}
    bench_forward.interleaved_ms({n: (lambda n=n: n) for n in ("sdpa", "attngen", "flex")}, row)
    assert calls == ["attngen", "flex", "sdpa", "flex", "sdpa", "attngen", "sdpa", "attngen", "flex"]
    assert (row["attngen_ms"], row["flex_ms"], row["sdpa_ms"]) == (1.0, 2.0, 3.0)
    assert bench_forward.rotated(["a", "b"], 3) == ["b", "a"] and bench_forward.rotated([], 1) == []

    def failing():
        raise RuntimeError("flex: out of resource")

    calls.clear()
    row = {}
    bench_forward.interleaved_ms({"attngen": lambda: "attngen", "flex": failing, "sdpa": lambda: "sdpa"}, row)
    assert "flex_ms" not in row and "out of resource" in row["flex_error"] and row["attngen_ms"] == 1.0
    assert calls == ["attngen", "sdpa", "sdpa", "attngen", "sdpa", "attngen"]  # rounds still start one further on
