"""The kernel correctness suite's checked call, shared by the sm80 (tests/gpu/test_kernel_gpu.py) and sm90
(tests/gpu/test_kernel_sm90.py) GPU tests: the fixture variants of tests/data/*.inc as torch mods, their captured
tensors and block summaries, and `run_case`, which launches one compiled library on poisoned outputs and judges
it against the float64 golden (tests/reference64.py) with the bound max(2 x error of an eager same-dtype torch
implementation, small atol)."""
from __future__ import annotations

import math

import torch

import reference64
from helpers import add_library, fixture_inc

VARIANTS = ("full", "causal", "softcap", "sliding", "alibi_doc", "bias2d_pad")
DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)


def suite_subdir(name, dtype, hd) -> str:
    """Subdirectory of one sm80 library in the suite's build set."""
    return f"{name}_{str(dtype).replace('torch.', '')}_{hd}"


def suite_sources(arch: str) -> dict:
    """The sm80 suite's build set for ``arch``: every (fixture, dtype, head dim) library in its own subdirectory."""
    from attngen.jit import render

    sources = {}
    for name in VARIANTS:
        for dtype in DTYPES:
            for hd in HEAD_DIMS:
                rendered = render.render_sources(fixture_inc(name), dtype, hd, arch)
                add_library(sources, suite_subdir(name, dtype, hd), rendered)
    return sources


ATOL = {torch.bfloat16: 4e-3, torch.float16: 5e-4}
LSE_ATOL = 1e-3


# --------------------------------------------------------------------------------------------------
# the fixture variants as torch code (b, h, q, kv broadcast index tensors; q absolute)


def make_captured(name, *, B, Hq, Lq, Lk, q_offset, device, gen, all_masked=False):
    n = max(Lk, Lq + max(q_offset, 0))
    if name == "alibi_doc":
        slopes = torch.exp2(-8.0 * torch.arange(1, Hq + 1, dtype=torch.float32) / Hq).to(device)
        doc = torch.sort(torch.randint(0, 5, (n,), generator=gen)).values.to(torch.int32).to(device)
        if all_masked:  # queries in a document no key belongs to
            doc[Lk:] = 1000
        return [slopes, doc]
    if name == "bias2d_pad":
        # (n, Lk) bias stored transposed: strides (1, n), exercising the captured strides
        bias = torch.randn(Lk, n, generator=gen).to(torch.bfloat16).to(device).t()
        keep = (torch.rand(Lk, generator=gen) < 0.7).to(device)
        if all_masked:
            keep[:] = False
        return [bias, keep]
    return []


def fixture_mods(name, captured):
    """(score_mod, mask_mod) of a fixture variant, FlexAttention signatures, computed in the scores' dtype
    (so the same mods serve the float64 golden and the same-dtype eager baseline). None: no mod."""
    if name == "full":
        return None, None
    if name == "causal":
        return None, lambda b, h, q, kv: q >= kv
    if name == "softcap":
        return (lambda s, b, h, q, kv: 20.0 * torch.tanh(s / 20.0)), None
    if name == "sliding":
        return None, lambda b, h, q, kv: (q >= kv) & (q - kv < 300)
    if name == "alibi_doc":
        slopes, doc = captured
        return (lambda s, b, h, q, kv: s + (slopes[h] * (kv - q)).to(s.dtype)), (lambda b, h, q, kv: doc[q] == doc[kv])
    if name == "bias2d_pad":
        bias, keep = captured
        return (lambda s, b, h, q, kv: s + bias[q, kv].to(s.dtype)), (lambda b, h, q, kv: keep[kv])
    raise KeyError(name)


def summaries(name, captured, *, Lq, Lk, q_offset, BQ, BK):
    if name != "alibi_doc":
        return []
    doc = captured[1]

    def minmax(x, blk):
        nb = -(-x.numel() // blk)
        pad = nb * blk - x.numel()
        x = torch.cat([x, x[-1:].expand(pad)]) if pad else x  # repeating a value keeps min/max
        x = x.view(nb, blk)
        return x.amin(1).to(torch.int32).contiguous(), x.amax(1).to(torch.int32).contiguous()

    qmin, qmax = minmax(doc[q_offset:q_offset + Lq], BQ)
    kmin, kmax = minmax(doc[:Lk], BK)
    return [qmin, qmax, kmin, kmax]


def eager_attention(q, k, v, *, score_mod, mask_mod, scale, q_offset):
    """Dense attention in q's dtype (scores, mods, softmax and P.V rounded to it; LSE from float32): the eager
    implementation whose error against float64 sets the bound a kernel must meet. Rows with nothing kept give
    0 and -inf."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    kf = k.repeat_interleave(rep, dim=1)
    vf = v.repeat_interleave(rep, dim=1)
    s = (q @ kf.transpose(-1, -2)) * scale
    b, h, qi, kv = reference64.index_grid(B, Hq, Lq, Lk, q_offset, q.device)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, kv).expand(s.shape), float("-inf"))
    lse = torch.logsumexp(s.float(), dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # softmax of an all -inf row is NaN: nothing kept -> 0
    return p @ vf, lse


# --------------------------------------------------------------------------------------------------
# one checked call


def run_case(libs, name, dtype, hd, *, B=2, Hq=4, Hkv=2, Lq=77, Lk=200, q_offset=0, layout="bhld",
             all_masked=False, return_lse=True, scale=None, seed=0):
    from attngen import launch

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(seed)
    lib = libs(name, dtype, hd)

    def rand(shape_bhld):
        Bx, H, L, D = shape_bhld
        if layout == "blhd":  # (B, L, H, D) storage viewed as (B, H, L, D): non-contiguous strides
            return torch.randn(Bx, L, H, D, generator=gen).to(dtype).to(dev).transpose(1, 2)
        return torch.randn(Bx, H, L, D, generator=gen).to(dtype).to(dev)

    q = rand((B, Hq, Lq, hd))
    k = rand((B, Hkv, Lk, hd))
    v = rand((B, Hkv, Lk, hd))
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    captured = make_captured(name, B=B, Hq=Hq, Lq=Lq, Lk=Lk, q_offset=q_offset, device=dev, gen=gen,
                             all_masked=all_masked)
    sums = summaries(name, captured, Lq=Lq, Lk=Lk, q_offset=q_offset, BQ=lib.block_q, BK=lib.block_k)

    # Poisoned outputs with canaries: out is a view into a larger NaN buffer (extra rows after Lq),
    # lse the head of a larger NaN buffer. The kernel must write every valid element and nothing else.
    out_buf = torch.full((B, Hq, Lq + 5, hd), float("nan"), dtype=dtype, device=dev)
    out = out_buf[:, :, :Lq]
    lse_buf = torch.full((B * Hq * Lq + 7,), float("nan"), dtype=torch.float32, device=dev)
    lse = lse_buf[: B * Hq * Lq].view(B, Hq, Lq)
    res = launch.forward(lib, q, k, v, scale=scale, q_offset=q_offset, return_lse=return_lse,
                          captured=captured, summaries=sums, out=out, lse_out=lse if return_lse else None)
    torch.cuda.synchronize()
    if return_lse:
        o_k, l_k = res
        assert l_k is lse
    else:
        o_k, l_k = res, None
    assert o_k is out

    assert torch.isnan(out_buf[:, :, Lq:]).all(), "kernel wrote past the last query row"
    assert torch.isnan(lse_buf[B * Hq * Lq:]).all(), "kernel wrote past the end of lse"
    if not return_lse:
        assert torch.isnan(lse_buf).all(), "kernel wrote lse although none was asked for"

    score_mod, mask_mod = fixture_mods(name, captured)
    mods = dict(score_mod=score_mod, mask_mod=mask_mod, scale=scale, q_offset=q_offset)
    o_ref, l_ref = reference64.attention(q, k, v, **mods)
    o_eag, l_eag = eager_attention(q, k, v, **mods)
    assert not torch.isnan(o_k).any(), "NaN in the output (unwritten or NaN-producing rows)"

    dead = torch.isinf(l_ref) & (l_ref < 0)  # rows with nothing kept
    if dead.any():
        assert (o_k[dead] == 0).all(), "rows with nothing kept must be exactly 0"
        if l_k is not None:
            assert torch.isneginf(l_k[dead]).all(), "rows with nothing kept must have lse = -inf"
    live = ~dead
    err = (o_k.double() - o_ref)[live].abs().max().item() if live.any() else 0.0
    err_eager = (o_eag.double() - o_ref)[live].abs().max().item() if live.any() else 0.0
    bound = max(2 * err_eager, ATOL[dtype])
    assert err <= bound, f"max |out - ref| = {err:.3e} > bound {bound:.3e} (eager {dtype}: {err_eager:.3e})"
    if l_k is not None and live.any():
        lerr = (l_k.double() - l_ref)[live].abs().max().item()
        lerr_eager = (l_eag.double() - l_ref)[live].abs().max().item()
        lbound = max(2 * lerr_eager, LSE_ATOL)
        assert lerr <= lbound, f"max |lse - ref| = {lerr:.3e} > bound {lbound:.3e} (eager: {lerr_eager:.3e})"
        assert not torch.isnan(l_k).any()
    return err, err_eager


def check_empty_kv(lib):
    """No keys at all: every row is fully masked, O = 0 and LSE = -inf (shared by the sm80 and sm90 suites)."""
    from attngen import launch

    q = torch.randn(1, 2, 5, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 0, 64, device="cuda", dtype=torch.bfloat16)
    out, lse = launch.forward(lib, q, k, k, return_lse=True)
    torch.cuda.synchronize()
    assert (out == 0).all() and torch.isneginf(lse).all()
    return q, k


def check_side_stream(lib):
    """A launch on a side stream (torch's current stream there) gives what the default stream gives:
    deterministic kernel, same inputs. Shared by the sm80 and sm90 suites."""
    from attngen import launch

    q = torch.randn(2, 4, 300, lib.head_dim, device="cuda", dtype=lib.dtype)
    ref = launch.forward(lib, q, q, q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = launch.forward(lib, q, q, q)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
