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
    bf16 eager implementation's error of float64, and within a bf16 rounding of each other (the same score_rel at
    the same d; the two kernels are different programs to ptxas, whose contractions of the softmax's multiplies and
    adds may differ: round C of session 25 found the mod with factor and bias from the table differing in the last
    bits of 40% of its rows, both 5-6e-3 from float64, the table and the division bit for bit). GQA, odd lengths (a
    partial last q tile and kv tile), q_offset; under a window the kv tiles a q tile visits start mid-sequence (the
    persistent grid, more work tiles than SMs), and rows at the ends see clamped table indices; without a mask the
    wide K/V tiles at head dim 128 (BK = 176)."""
    import attngen.jit.spec as spec
    from attngen.jit.tiles import sm90_ladder

    B, Hq, Hkv, Lq, Lk, q_offset = 2, 4, 2, 1100, 2450, 130
    gen = torch.Generator(device="cpu").manual_seed(hd)
    q = torch.randn(B, Hq, Lq, hd, generator=gen).to(DEV, torch.bfloat16)
    k, v = (torch.randn(B, Hkv, Lk, hd, generator=gen).to(DEV, torch.bfloat16) for _ in range(2))
    results, paths = {}, set()
    for staged in (True, False):
        monkeypatch.setattr(spec, "sm90_ladder",
                            lambda *a, s=staged, **kw: tuple(replace(t, rel_stage=s) for t in sm90_ladder(*a, **kw)))
        attn = attngen.compile(score_mod=attngen.ScoreMod(_mods()[mod], f"rel_{mod}"), window=window)
        assert all(t.rel_stage is staged for t in attn.spec(torch.bfloat16, hd, "sm_90a", "sm90").tile_choices())
        paths.add(attn.library(torch.bfloat16, hd, torch.cuda.current_device(), "sm90").path)
        _poison()
        results[staged] = attn(q, k, v, return_lse=True, q_offset=q_offset)
        torch.cuda.synchronize()
    assert len(paths) == 2, "both settings loaded one library"
    (out, lse), (out0, lse0) = results[True], results[False]
    for staged, (o, l) in results.items():
        assert_matches_float64(f"rel_{mod} hd{hd} window {window} staged {staged}", o, l, q, k, v, attn.variant,
                               hd ** -0.5, q_offset)
    assert (out.float() - out0.float()).abs().max().item() <= 2 ** -7 * out0.float().abs().max().item()
    assert torch.equal(torch.isfinite(lse), torch.isfinite(lse0))
    assert (lse - lse0)[torch.isfinite(lse0)].abs().max().item() <= 1e-5 * lse0[torch.isfinite(lse0)].abs().max().item()
