"""Plain helpers shared by test modules (no tests here): the fixture variant.inc files in tests/data/, random
inputs and LSE comparison for the reference tests, the sm90 fallback codes, fresh interpreters per hash seed."""
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
