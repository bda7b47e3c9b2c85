"""The float functions beyond tanh/exp/log a mod may call (torch.tan, atan, log1p, expm1, erf, sign, pow with a
float exponent, and the math.* spellings): each traces, evaluates in the torch printer exactly as torch eager
does on random inputs, and prints to the CUDA function of the same meaning. (tests/test_codegen.py compiles
and host-checks the printed code: the "mathfns" case of tests/codegen_cases.py.)"""
import math

import pytest
import torch

import attngen
from attngen.printer import CudaPrinter, torch_function
from attngen.symbols import B, H, KV, Q, SCORE
from attngen.trace import trace

ARGS = [SCORE, B, H, Q, KV]

MODS = {
    "tan": (lambda s, b, h, q, kv: torch.tan(s / 4), "tanf("),
    "atan": (lambda s, b, h, q, kv: torch.atan(s), "atanf("),
    "arctan": (lambda s, b, h, q, kv: torch.arctan(s), "atanf("),
    "log1p": (lambda s, b, h, q, kv: torch.log1p(s.abs()), "log1pf("),
    "expm1": (lambda s, b, h, q, kv: torch.expm1(s / 10), "expm1f("),
    "erf": (lambda s, b, h, q, kv: torch.erf(s), "erff("),
    "sign": (lambda s, b, h, q, kv: torch.sign(s) * 2, "ag_sign("),
    "sign_int": (lambda s, b, h, q, kv: s + torch.sign(q - kv), "ag_sign("),
    "pow_op": (lambda s, b, h, q, kv: s.abs() ** 1.5, "powf("),
    "pow_fn": (lambda s, b, h, q, kv: torch.pow(s.abs(), 0.75), "powf("),
    "pow_half": (lambda s, b, h, q, kv: torch.pow(s.abs(), 0.5), "sqrtf("),
    "methods": (lambda s, b, h, q, kv: s.tan() + s.atan() + s.abs().log1p() + s.expm1() + s.erf() + s.sign(), "log1pf("),
    "math_shims": (lambda s, b, h, q, kv: math.tan(s / 4) + math.atan(s) + math.log1p(abs(s)) + math.expm1(s / 10)
                   + math.erf(s), "expm1f("),
}


def _grid(gen):
    score = torch.randn(1, 2, 16, 24, generator=gen, dtype=torch.float64) * 3
    score[0, 0, 0, :4] = torch.tensor([0.0, -0.0, 1e-9, -1e-9], dtype=torch.float64)  # where log1p/expm1/sign matter
    b = torch.zeros(1, 1, 1, 1, dtype=torch.int64)
    h = torch.arange(2).view(1, 2, 1, 1)
    q = torch.arange(16).view(1, 1, 16, 1)
    kv = torch.arange(24).view(1, 1, 1, 24)
    return score, b, h, q, kv


@pytest.mark.parametrize("name", list(MODS))
def test_traces_evaluates_like_torch_and_prints_cuda(name):
    mod, cuda_call = MODS[name]
    v = attngen.Variant(score_mod=mod)
    traced = trace(v)
    grid = _grid(torch.Generator().manual_seed(len(name)))
    want = v.score_mod(*grid)  # torch eager on the same float64 inputs (the reference path)
    got = torch_function(traced.score, ARGS)(*grid)
    torch.testing.assert_close(torch.broadcast_to(torch.as_tensor(got), want.shape), want, rtol=1e-12, atol=1e-12)
    for fast in (True, False):
        assert cuda_call in CudaPrinter(fast, fast).doprint(traced.score)


def test_no_fast_approximation_replaces_the_accurate_functions():
    """log1p/expm1 exist for their accuracy near 0, and tan/erf/pow have no approximate instruction accurate
    enough: fast_math leaves them as the libdevice functions."""
    traced = trace(attngen.Variant(score_mod=MODS["methods"][0]))
    text = CudaPrinter(True, True).doprint(traced.score)
    for fn in ("tanf(", "atanf(", "log1pf(", "expm1f(", "erff(", "ag_sign("):
        assert fn in text
    assert "__" not in text


def test_reference_path_runs_the_new_functions():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 32, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    mod = MODS["methods"][0]
    out = attngen.compile(score_mod=mod)(q, k, v)
    s = (q @ k.transpose(-1, -2)) / 4.0
    want = torch.softmax(mod(s, None, None, None, None), dim=-1) @ v
    torch.testing.assert_close(out, want)
