"""Gradients of captured tensors summed inside the sm90 backward (templates/bwd_grad_sites.cuh): every kind of
site (one value per tile: ALiBi slopes, a learnable per-head softcap; one per diagonal: relative-position tables,
also read at negative indices; one per element: a pair bias, a per-key bias), with masks, GQA / MQA, odd
lengths, q_len != kv_len, q_offset, head dims 64 / 128, bf16 and fp16, and an expanded (overlapping) captured
view. Judged like tests/gpu/test_autograd_gpu.py: each gradient within ~2x the error of a same-dtype eager
implementation's against float64, and the hook checks that the kernel (not the float32 recompute) ran.
"""
import concurrent.futures as cf
import functools
import os
import types
import zlib

import pytest
import torch

import attngen
import reference64
from test_autograd_gpu import _eager, _loss

pytestmark = pytest.mark.requires_gpu

DEV = "cuda"
NPOS = 400  # positions the tables cover: q_offset + Lq and Lk stay below
H = 4


@functools.lru_cache(maxsize=None)
def data() -> types.SimpleNamespace:
    gen = torch.Generator().manual_seed(5)

    def leaf(*shape, scale=0.5, shift=0.0):
        return (torch.randn(*shape, generator=gen) * scale + shift).to(DEV).requires_grad_()

    slopes = torch.exp2(-torch.arange(1, H + 1, dtype=torch.float32)).to(DEV).requires_grad_()
    table = leaf(H, 2 * NPOS - 1)
    wrap = leaf(H, 2 * NPOS)        # read at q - kv, negative below the diagonal: torch wraps
    pair = leaf(NPOS, NPOS)
    kbias = leaf(H, NPOS)
    cap = leaf(H, scale=1.0, shift=8.0)
    base = torch.tensor(0.3, device=DEV).requires_grad_()
    shared = base.expand(H)          # one slope for every head: an overlapping view

    def alibi(s, b, h, q, kv):
        return s + slopes[h] * (kv - q)

    def relpos(s, b, h, q, kv):
        return s + table[h, q - kv + NPOS - 1]

    def relpos_wrap(s, b, h, q, kv):
        return s + wrap[h, q - kv]

    def pair_bias(s, b, h, q, kv):
        return s + pair[q, kv]

    def key_bias(s, b, h, q, kv):  # a per-query bias would have zero gradient: softmax ignores row constants
        return s + kbias[h, kv]

    def learned_softcap(s, b, h, q, kv):
        return cap[h] * torch.tanh(s / cap[h]) + table[h, q - kv + NPOS - 1]

    def shared_slope(s, b, h, q, kv):
        return s + shared[h] * (kv - q)

    variants = {
        "alibi_causal": (attngen.compile(score_mod=alibi, causal=True), [slopes]),
        "relpos": (attngen.compile(score_mod=relpos), [table]),
        "relpos_wrap_window": (attngen.compile(score_mod=relpos_wrap, window=96), [wrap]),
        "pair_bias_causal": (attngen.compile(score_mod=pair_bias, causal=True), [pair]),
        "key_bias": (attngen.compile(score_mod=key_bias), [kbias]),
        "learned_softcap": (attngen.compile(score_mod=learned_softcap, causal=True), [cap, table]),
        "shared_slope": (attngen.compile(score_mod=shared_slope), [base]),
    }
    return types.SimpleNamespace(variants=variants)


# (variant, dtype, head dim, B, Hq, Hkv, Lq, Lk, q_offset)
CASES = [
    ("alibi_causal", torch.bfloat16, 128, 2, 4, 2, 300, 300, 0),
    ("alibi_causal", torch.float16, 64, 1, 4, 1, 131, 250, 119),
    ("relpos", torch.bfloat16, 64, 2, 4, 4, 257, 131, 0),
    ("relpos", torch.bfloat16, 128, 1, 4, 2, 200, 390, 10),
    ("relpos_wrap_window", torch.bfloat16, 64, 1, 4, 2, 333, 333, 0),
    ("pair_bias_causal", torch.bfloat16, 128, 1, 4, 4, 190, 190, 0),
    ("key_bias", torch.float16, 128, 2, 4, 1, 77, 300, 200),
    ("learned_softcap", torch.bfloat16, 64, 1, 4, 2, 256, 256, 0),
    ("shared_slope", torch.bfloat16, 128, 1, 4, 4, 100, 100, 0),
]


@pytest.fixture(scope="module", autouse=True)
def prebuilt(requires_gpu):
    """Forward and sm90 backward libraries of every case, built in parallel."""
    if attngen.jit.toolchain.current_arch() != "sm_90a":
        pytest.skip("the captured-tensor gradients are summed by the sm90 backward (H100/H200)")
    V = data().variants
    specs = {(n, dt, hd, kernel) for n, dt, hd, *_ in CASES for kernel in ("sm90", "sm90_bwd")}
    with cf.ThreadPoolExecutor(max_workers=int(os.environ.get("ATTNGEN_TEST_BUILD_JOBS", "8"))) as ex:
        for f in [ex.submit(lambda s: V[s[0]][0].spec(s[1], s[2], "sm_90a", s[3]).build_cached(), s)
                  for s in sorted(specs, key=str)]:
            f.result()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{str(c[1])[6:]}-hd{c[2]}-{c[3]}x{c[4]}x{c[5]}-"
                                                      f"{c[6]}x{c[7]}+{c[8]}")
def test_captured_gradients_in_the_kernel_match_float64(case, monkeypatch):
    import attngen.autograd as ag

    name, dt, D, B, Hq, Hkv, Lq, Lk, q_offset = case
    attn, leaves = data().variants[name]
    scale = D ** -0.5
    gen = torch.Generator(device=DEV).manual_seed(zlib.crc32(repr(case).encode()) & 0xFFFF)
    q, k, v = (torch.randn(B, h, L, D, device=DEV, dtype=dt, generator=gen).requires_grad_()
               for h, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    ran = []
    hook = ag.backward_kernel
    monkeypatch.setattr(ag, "backward_kernel", lambda *a: ran.append(hook(*a)) or ran[-1])

    x = torch.full(((64 << 20) // 4,), float("nan"), device=DEV)  # the allocator's blocks poisoned
    del x
    out = attn(q, k, v, q_offset=q_offset)
    w_out = torch.randn(out.shape, device=DEV, dtype=torch.float64, generator=gen)
    got = torch.autograd.grad(_loss(out, out.new_zeros(()), w_out, 0.0), [q, k, v, *leaves])
    assert len(ran) == 1 and ran[0] is not None, "the sm90 backward kernel ran (not the float32 recompute)"

    e_out, e_lse = _eager(q, k, v, attn.variant, scale, q_offset)
    eager = torch.autograd.grad(_loss(e_out, e_lse, w_out, 0.0), [q, k, v, *leaves])
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    r_out, r_lse = reference64.attention(q64, k64, v64, attn, q_offset=q_offset, scale=scale)
    gold = torch.autograd.grad(_loss(r_out, r_lse, w_out, 0.0), [q64, k64, v64, *leaves])

    names = ["dq", "dk", "dv"] + [f"d(captured {i})" for i in range(len(leaves))]
    for what, g, e, r in zip(names, got, eager, gold):
        assert g.shape == r.shape, what
        assert torch.isfinite(g).all(), f"{name} {what}: non-finite gradient"
        err = (g.double() - r.double()).abs().max().item()
        eager_err = (e.double() - r.double()).abs().max().item()
        slack = 1e-3 * r.abs().max().item()
        assert err <= 2.0 * eager_err + slack, f"{name} {what}: err {err:.3e} > 2 x eager err {eager_err:.3e}"
    for what, g, r in zip(names[3:], got[3:], gold[3:]):
        assert r.abs().max().item() > 1e-3, f"{name} {what}: the gradient is ~0, the comparison checks nothing"
