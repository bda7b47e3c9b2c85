"""Plain helpers shared by test modules (no tests here): the fixture variant.inc files in tests/data/, random
inputs and LSE comparison for the reference tests, the sm90 fallback codes, fresh interpreters per hash seed,
the brute-force block map of a dense mask, and the float64 judgement of a kernel's output (GPU tests)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent / "data"
# the sm90 library's fallback return codes, as the tests expect to see them (tests/test_abi.py ties attngen.abi
# to the C headers; these literals pin the values the error messages print)
ERR_TMA_LAYOUT = 9001
ERR_NO_TMA_ENCODER = 9002


def fixture_inc(name: str) -> str:
    """Text of tests/data/<name>.inc (a hand-written or previously generated variant.inc)."""
    return (DATA / f"{name}.inc").read_text()


def add_library(sources: dict, sub: str, rendered: dict) -> None:
    """Put one rendered forward library into a many-library build set: its own units (kernel source, the KV-cache
    unit when it has one, variant.inc) under ``sub``/, the shared headers at the top. A unit left at the top would
    be compiled there, beside no variant.inc."""
    from attngen.jit import render

    rendered = dict(rendered)
    for f in (render.KERNEL_SOURCE, render.DECODE_SOURCE, render.VARIANT_INCLUDE):
        if f in rendered:
            sources[f"{sub}/{f}"] = rendered.pop(f)
    sources.update(rendered)


def rand_qkv(gen, B, Hq, Hkv, Lq, Lk, D, Dv, dtype=torch.float64, requires_grad=False):
    """q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv): standard normal, drawn in float64 from `gen`."""
    def r(*shape):
        t = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
        return t.requires_grad_(requires_grad)

    return r(B, Hq, Lq, D), r(B, Hkv, Lk, D), r(B, Hkv, Lk, Dv)


def assert_lse_close(lse, ref, atol, rtol=0.0):
    """Same fully masked rows (-inf), no NaN, and the finite entries close."""
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref)), "fully masked rows differ"
    assert not torch.isnan(lse).any()
    fin = torch.isfinite(ref)
    torch.testing.assert_close(lse[fin].double(), ref[fin], atol=atol, rtol=rtol)


def run_with_hash_seeds(code: str, seeds, cwd=None, timeout: float = 300) -> dict:
    """Run `python -c code` in a fresh interpreter per PYTHONHASHSEED, all at once (each one spends seconds
    importing torch); {seed: (returncode, stdout, stderr)}."""
    procs = {}
    try:
        for seed in seeds:
            procs[seed] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True, env=dict(os.environ, PYTHONHASHSEED=seed), cwd=cwd)
        results = {}
        for seed, p in procs.items():
            out, err = p.communicate(timeout=timeout)
            results[seed] = (p.returncode, out, err)
        return results
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def eager_attention(q, k, v, variant, scale, q_offset=0):
    """Same-dtype eager attention: scores, mods and probabilities rounded to the input dtype (the yardstick a
    kernel's error is judged against)."""
    dt = q.dtype
    B, Hq, Lq, D = q.shape
    rep = Hq // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ kk.transpose(-1, -2)) * scale
    idx = (torch.arange(B, device=q.device)[:, None, None, None], torch.arange(Hq, device=q.device)[None, :, None, None],
           torch.arange(Lq, device=q.device)[None, None, :, None] + q_offset,
           torch.arange(k.shape[2], device=q.device)[None, None, None, :])
    if variant.score_mod is not None:
        s = variant.score_mod(s, *idx).to(dt)
    if variant.mask_mod is not None:
        s = s.masked_fill(~torch.as_tensor(variant.mask_mod(*idx)).expand_as(s), float("-inf"))
    p = torch.softmax(s.float(), -1).nan_to_num(0.0).to(dt)
    return p @ vv


def assert_matches_float64(what, out, lse, q, k, v, variant, scale, q_offset=0):
    """Judge a kernel's (out, lse) as FlexAttention's tests judge bf16/fp16 kernels: error against the float64
    golden (tests/reference64.py) at most 2x the same-dtype eager error (plus a tiny absolute slack), the same
    fully masked rows, and zeros there. Returns (kernel error, eager error)."""
    import reference64

    ref, ref_lse = reference64.attention(q, k, v, variant, scale=scale, q_offset=q_offset)
    eager = eager_attention(q, k, v, variant, scale, q_offset)
    err = (out.double() - ref).abs().max().item()
    eager_err = (eager.double() - ref).abs().max().item()
    assert torch.isfinite(out).all(), f"{what}: non-finite output"
    assert err <= 2.0 * eager_err + 1e-4, f"{what}: kernel err {err:.3e} > 2 x eager err {eager_err:.3e}"
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite), f"{what}: LSE -inf pattern differs from the reference"
    if finite.any():
        lse_err = (lse.double()[finite] - ref_lse[finite]).abs().max().item()
        assert lse_err <= 2e-2, f"{what}: LSE err {lse_err:.3e}"
    if (~finite).any():
        assert (out[~finite] == 0).all(), f"{what}: fully masked rows must be 0"
    return err, eager_err


def tile_classes(m, BQ, BK):
    """Brute-force block map of a dense (q_len, kv_len) bool mask: int8 per tile, 0 empty, 1 partial, 2 full
    (attngen.blockmap's EMPTY/PARTIAL/FULL); padding past the lengths counts as neither kept nor masked."""
    q_len, kv_len = m.shape
    nqb, nkb = -(-q_len // BQ), -(-kv_len // BK)
    padded = torch.full((nqb * BQ, nkb * BK), -1, dtype=torch.int8)
    padded[:q_len, :kv_len] = m.to(torch.int8)
    tiles = padded.reshape(nqb, BQ, nkb, BK).permute(0, 2, 1, 3).reshape(nqb, nkb, -1)
    any_kept = (tiles == 1).any(-1)
    all_kept = ~(tiles == 0).any(-1)
    return torch.where(all_kept, 2, torch.where(any_kept, 1, 0)).to(torch.int8)


def training_variants(slopes, table, docs, npos: int, window: int, softcap: float) -> dict:
    """The variants the autograd tests differentiate (CPU and GPU suites, each with its own sizes): library
    mods, ALiBi with a slopes tensor, a relative-position table (2 * npos - 1 entries per head) and a document
    mask whose first tokens see nothing (fully masked rows)."""
    import attngen

    def relpos(s, b, h, q_idx, kv_idx):
        return s + table[h, q_idx - kv_idx + npos - 1]

    def doc_strict(b, h, q_idx, kv_idx):
        # the first token of each document sees nothing: fully masked rows
        return (docs[q_idx] == docs[kv_idx]) & (kv_idx < q_idx)

    return {
        "full": attngen.compile(),
        "causal": attngen.compile(causal=True),
        "sliding_window": attngen.compile(window=window),
        "softcap": attngen.compile(softcap=softcap),
        "alibi": attngen.compile(score_mod=attngen.alibi(slopes), causal=True),
        "relpos": attngen.compile(score_mod=relpos),
        "document": attngen.compile(mask_mod=doc_strict),
    }


def param_values(params) -> dict:
    """{symbol: current value} of runtime parameters (ParamSlots): what a test substitutes to evaluate a variant's
    symbolic expressions at the values a kernel or host program ran with."""
    return {p.symbol: p.param.value for p in params}


def predicates_with_values(preds, values: dict):
    """BlockPredicates with runtime parameters replaced by values ({symbol: value}, param_values)."""
    import dataclasses

    import sympy

    if not values:
        return preds
    subs = {k: sympy.sympify(v) for k, v in values.items()}

    def sub(x):  # expressions, and tuples of them (per-part ranges)
        if isinstance(x, sympy.Basic):
            return x.xreplace(subs)
        return tuple(sub(y) for y in x) if isinstance(x, tuple) else x

    return dataclasses.replace(preds, **{f.name: sub(getattr(preds, f.name)) for f in dataclasses.fields(preds)
                                         if f.name not in ("summaries", "notes")})
