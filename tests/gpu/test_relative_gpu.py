"""Relative score mods (score_mod(s) = a(d) s + b(d), d = q_idx - kv_idx) on the sm90 forward: each consumer warp's
terms staged once per diagonal in shared memory (jit.tiles.Sm90Tiles.rel_stage, score_mask.cuh's stage_rel_terms)
against each thread evaluating its own diagonals, and both against the float64 golden (needs an H100 / H200)."""
from dataclasses import replace

import pytest
import torch

import attngen
from helpers import assert_matches_float64

pytestmark = pytest.mark.requires_sm90

DEV = "cuda"
L = 2600  # positions the table covers


def _table():
    return (torch.randn(4, 2 * L, generator=torch.Generator().manual_seed(7)) * 0.5).to(DEV)


def _mods():
    table = _table()
    return {
        # b read from a table, a = 1: the staged slots hold b alone
        "table": lambda s, b, h, q, kv: s + table[h, q - kv + L - 1],
        # a = 1 / (1 + c d^2), b = 0: the slots hold a alone (a reciprocal per diagonal, not per element pair)
        "division": lambda s, b, h, q, kv: s / (1 + 1e-3 * (q - kv) ** 2),
        # both depend on d: the slots hold (a scale, b)
        "both": lambda s, b, h, q, kv: s * (1 + 0.5 * table[h, q - kv + L - 1]) + table[h, kv - q + L - 1],
    }


def _poison(nbytes=256 << 20):
    x = torch.full((nbytes // 4,), float("nan"), device=DEV)
    del x


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("mod,window", [("table", 700), ("division", None), ("both", 700)])
def test_staged_relative_terms_match_each_threads_walk(hd, mod, window, monkeypatch):
    """The forward with the warp's terms staged (rel_stage) against each thread's own evaluations: both within 2x a
    bf16 eager implementation's error of float64; bit for bit where both build on the same rung of the ladder (the
    same score_rel at the same d, the same tiles), else within a bf16 rounding of each other (the mod with factor and
    bias from the table spills unstaged on the first rung and builds at BK 96 (hd 64) or 64 (hd 128): other tiles,
    other stale row maxima and sums; session 25 rounds C, F). GQA, odd lengths (a partial last q tile and kv tile),
    q_offset; under a window the kv tiles a q tile visits start mid-sequence (the persistent grid, more work tiles
    than SMs), and rows at the ends see clamped table indices; without a mask the wide K/V tiles at head dim 128
    (BK = 176)."""
    import attngen.jit.spec as spec
    from attngen.jit.tiles import sm90_ladder

    B, Hq, Hkv, Lq, Lk, q_offset = 2, 4, 2, 1100, 2450, 130
    gen = torch.Generator(device="cpu").manual_seed(hd)
    q = torch.randn(B, Hq, Lq, hd, generator=gen).to(DEV, torch.bfloat16)
    k, v = (torch.randn(B, Hkv, Lk, hd, generator=gen).to(DEV, torch.bfloat16) for _ in range(2))
    results, paths, block_k = {}, set(), {}
    for staged in (True, False):
        monkeypatch.setattr(spec, "sm90_ladder",
                            lambda *a, s=staged, **kw: tuple(replace(t, rel_stage=s) for t in sm90_ladder(*a, **kw)))
        attn = attngen.compile(score_mod=attngen.ScoreMod(_mods()[mod], f"rel_{mod}"), window=window)
        assert all(t.rel_stage is staged for t in attn.spec(torch.bfloat16, hd, "sm_90a", "sm90").tile_choices())
        lib = attn.library(torch.bfloat16, hd, torch.cuda.current_device(), "sm90")
        paths.add(lib.path)
        block_k[staged] = lib.block_k  # the rung the build took (each rung of the ladder has its own BK)
        _poison()
        results[staged] = attn(q, k, v, return_lse=True, q_offset=q_offset)
        torch.cuda.synchronize()
    assert len(paths) == 2, "both settings loaded one library"
    (out, lse), (out0, lse0) = results[True], results[False]
    for staged, (o, l) in results.items():
        assert_matches_float64(f"rel_{mod} hd{hd} window {window} staged {staged}", o, l, q, k, v, attn.variant,
                               hd ** -0.5, q_offset)
    if block_k[True] == block_k[False]:
        assert torch.equal(out, out0) and torch.equal(lse, lse0)
    else:
        assert mod == "both", block_k  # the one mod whose walk spills on the first rung
        assert (out.float() - out0.float()).abs().max().item() <= 2 ** -7 * out0.float().abs().max().item()
        fin = torch.isfinite(lse0)
        assert torch.equal(torch.isfinite(lse), fin)
        assert (lse - lse0)[fin].abs().max().item() <= 1e-5 * lse0[fin].abs().max().item()
