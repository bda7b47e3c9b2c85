"""Runtime parameters on the GPU: ONE build of each parameterised library variant serves many values, each
matching the float64 golden (tests/reference64.py, evaluated with the value of the call), on the sm80 and the
sm90 kernel; the backward kernel takes the values too. Issue 14.1's acceptance: one sliding_window build serves
windows 128 .. 65536, one softcap build any cap.
"""
import os

import pytest
import torch

import attngen
from helpers import assert_matches_float64

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
BACKEND = os.environ.get("ATTNGEN_TEST_BACKEND", "auto")

# name -> (compile kwargs of the first value, further value tuples in attn.params order)
CASES = {
    "sliding_window": (dict(window=128), [(1,), (1000,), (4096,), (65536,)]),
    "softcap": (dict(softcap=30.0), [(1.0,), (50.5,), (1000.0,)]),
    "softcap_window": (dict(softcap=30.0, window=1024), [(77, 5.0), (65536, 50.0)]),
    "local": (dict(window=(64, 16)), [(0, 0), (300, 0), (5, 700)]),
    "prefix_lm": (dict(mask_mod=attngen.prefix_lm(100)), [(0,), (1500,), (8000,)]),
    "chunked": (dict(mask_mod=attngen.chunked(128)), [(1,), (100,), (2048,)]),
    "dilated": (dict(mask_mod=attngen.dilated(512, 4)), [(64,), (2000,)]),  # the dilation is part of the build
    "alibi_causal": (dict(score_mod=attngen.alibi(8), causal=True), [(8,), (16,)]),
}


def _inputs(dtype, D, Lq, Lk, Hq=8, Hkv=2, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(2, Hq, Lq, D, device=DEV, dtype=dtype, generator=g)
    k, v = (torch.randn(2, Hkv, Lk, D, device=DEV, dtype=dtype, generator=g) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_one_build_serves_every_value(name, dtype):
    kwargs, values = CASES[name]
    attn = attngen.compile(**kwargs, backend=BACKEND)
    D, Lq, Lk = 128, 1031, 2100
    q, k, v = _inputs(dtype, D, Lq, Lk)
    first = tuple(p.value for p in attn.params)
    for vals in [first] + values:
        for p, x in zip(attn.params, vals):
            p.set(x)
        for q_offset in (0, Lk - Lq):
            out, lse = attn(q, k, v, return_lse=True, q_offset=q_offset)
            torch.cuda.synchronize()
            assert_matches_float64(f"{name}{vals} {dtype} q_offset={q_offset}", out, lse, q, k, v, attn.variant,
                                   D ** -0.5, q_offset)
    # one library per signature, whatever the values; a fresh compile of another value finds the same one
    assert len({id(lib) for lib in attn._libraries.values()}) == len(attn._libraries) <= 2
    dev = torch.cuda.current_device()
    lib = attn.library(dtype, D, dev)
    other = attngen.compile(**kwargs, backend=BACKEND)
    for p, x in zip(other.params, values[-1]):
        p.set(x)
    assert other.library(dtype, D, dev).path == lib.path


def test_specialised_and_runtime_builds_agree():
    q, k, v = _inputs(torch.bfloat16, 64, 700, 900)
    for window, cap in ((33, 2.0), (512, 30.0)):
        rt = attngen.compile(mask_mod=attngen.sliding_window(window), score_mod=attngen.softcap(cap), backend=BACKEND)
        sp = attngen.compile(mask_mod=attngen.sliding_window(window, specialize=True),
                             score_mod=attngen.softcap(cap, specialize=True), backend=BACKEND)
        a, b = rt(q, k, v, q_offset=200), sp(q, k, v, q_offset=200)
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)  # tanh.approx of x*(1/cap) vs a folded constant


def test_backward_kernel_takes_the_values():
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the kernels need sm80+")
    attn = attngen.compile(softcap=20.0, window=256)
    for window, cap in ((256, 20.0), (40, 3.0), (4000, 60.0)):
        attn.params[0].set(window), attn.params[1].set(cap)
        q, k, v = (x.requires_grad_() for x in _inputs(torch.bfloat16, 64, 512, 512, seed=window))
        out = attn(q, k, v)
        dout = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
        ref = attngen.reference.attention(q64, k64, v64, attn.variant)
        rq, rk, rv = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
        for name, got, want in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
            err = (got.double() - want).abs().max().item()
            assert err <= 5e-2 * max(1.0, want.abs().max().item()), f"window {window} cap {cap}: {name} err {err:.3e}"
