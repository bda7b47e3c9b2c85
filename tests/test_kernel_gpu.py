"""GPU tests of the sm80 forward kernel: compiled fixture variants (tests/data/*.inc) against float64
references written here, with the error bound max(2 x error of an eager same-dtype torch
implementation, small atol). Skipped without CUDA.

Set ATTNGEN_TEST_BUILD_DIR to keep (and reuse) the compiled libraries between runs.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

DATA = Path(__file__).parent / "data"
VARIANTS = ("full", "causal", "softcap", "sliding", "alibi_doc", "bias2d_pad")
DTYPES = (torch.bfloat16, torch.float16)
HEAD_DIMS = (64, 128, 256)
ATOL = {torch.bfloat16: 4e-3, torch.float16: 5e-4}
LSE_ATOL = 1e-3


# --------------------------------------------------------------------------------------------------
# building every (variant, dtype, head dim) once, in one parallel ninja run


@pytest.fixture(scope="session")
def libs(tmp_path_factory):
    from attngen import build, runtime

    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the kernels need sm80+")
    arch = build.current_arch()
    build_dir = Path(os.environ.get("ATTNGEN_TEST_BUILD_DIR") or tmp_path_factory.mktemp("attngen_gpu_build"))
    sources = {}
    for name in VARIANTS:
        inc = (DATA / f"{name}.inc").read_text()
        for dtype in DTYPES:
            for hd in HEAD_DIMS:
                sub = f"{name}_{str(dtype).replace('torch.', '')}_{hd}"
                src = build.render_sources(inc, dtype, hd, arch)
                sources[f"{sub}/{build.KERNEL_SOURCE}"] = src.pop(build.KERNEL_SOURCE)
                sources[f"{sub}/{build.VARIANT_INCLUDE}"] = src.pop(build.VARIANT_INCLUDE)
                sources.update(src)  # shared headers at the top of the build directory
    build.write_build_ninja(build_dir, sources, arch)
    build.run_ninja(build_dir, jobs=os.cpu_count())
    cache = {}

    def get(name, dtype, hd):
        key = (name, dtype, hd)
        if key not in cache:
            sub = f"{name}_{str(dtype).replace('torch.', '')}_{hd}"
            cache[key] = runtime.load_library(build_dir / sub / build.LIBRARY_NAME)
        return cache[key]

    return get


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


def apply_mods(name, s, b, h, q, kv, captured, dtype):
    """Scores s (scaled) -> (modified scores, keep mask or None), computed in s.dtype."""
    if name == "full":
        return s, None
    if name == "causal":
        return s, q >= kv
    if name == "softcap":
        return 20.0 * torch.tanh(s / 20.0), None
    if name == "sliding":
        return s, (q >= kv) & (q - kv < 300)
    if name == "alibi_doc":
        slopes, doc = captured
        s = s + (slopes[h] * (kv - q)).to(s.dtype)
        return s, doc[q] == doc[kv]
    if name == "bias2d_pad":
        bias, keep = captured
        return s + bias[q, kv].to(s.dtype), keep[kv]
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


def attention(name, q, k, v, *, scale, q_offset, captured, dtype):
    """Dense attention in `dtype` (float64 reference, or q's dtype for the eager baseline).
    Returns (out, lse); rows with nothing kept give 0 and -inf."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    qf, kf, vf = q.to(dtype), k.to(dtype), v.to(dtype)
    kf = kf.repeat_interleave(rep, dim=1)
    vf = vf.repeat_interleave(rep, dim=1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    dev = q.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(Hq, device=dev).view(1, Hq, 1, 1)
    qi = (torch.arange(Lq, device=dev) + q_offset).view(1, 1, Lq, 1)
    kv = torch.arange(Lk, device=dev).view(1, 1, 1, Lk)
    s, keep = apply_mods(name, s, b, h, qi, kv, captured, dtype)
    if keep is not None:
        s = s.masked_fill(~keep.expand(s.shape), float("-inf"))
    lse = torch.logsumexp(s.float() if dtype != torch.float64 else s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # softmax of an all -inf row is NaN: nothing kept -> 0
    out = p @ vf
    return out, lse


# --------------------------------------------------------------------------------------------------
# one checked call


def run_case(libs, name, dtype, hd, *, B=2, Hq=4, Hkv=2, Lq=77, Lk=200, q_offset=0, layout="bhld",
             all_masked=False, return_lse=True, scale=None, seed=0):
    from attngen import runtime

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
    res = runtime.forward(lib, q, k, v, scale=scale, q_offset=q_offset, return_lse=return_lse,
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

    o_ref, l_ref = attention(name, q, k, v, scale=scale, q_offset=q_offset, captured=captured, dtype=torch.float64)
    o_eag, l_eag = attention(name, q, k, v, scale=scale, q_offset=q_offset, captured=captured, dtype=dtype)
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


# --------------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", VARIANTS)
def test_variant(libs, name, dtype, hd):
    q_offset = 100 if name in ("alibi_doc", "bias2d_pad", "causal") else 0
    run_case(libs, name, dtype, hd, Lq=77, Lk=300, q_offset=q_offset)


@pytest.mark.parametrize("Lq,Lk", [(1, 1), (1, 77), (77, 1), (77, 77), (128, 128), (129, 64), (1000, 1000),
                                   (130, 1000), (1000, 130)])
@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("name", ["full", "causal"])
def test_lengths(libs, name, hd, Lq, Lk):
    # q_offset = Lk - Lq aligns the last query with the last key (decode / chunked prefill)
    run_case(libs, name, torch.bfloat16, hd, B=1, Hq=2, Hkv=1, Lq=Lq, Lk=Lk, q_offset=max(Lk - Lq, 0))


@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_gqa_mqa_and_strides(libs, dtype, hd):
    run_case(libs, "causal", dtype, hd, B=3, Hq=8, Hkv=1, Lq=150, Lk=150, layout="blhd")  # MQA
    run_case(libs, "softcap", dtype, hd, B=2, Hq=6, Hkv=3, Lq=65, Lk=333, layout="blhd")  # GQA


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("q_offset", [-300, -50, 7, 500])
def test_q_offset(libs, hd, q_offset):
    # negative offsets: the first queries precede every key, so their rows are fully masked
    run_case(libs, "causal", torch.bfloat16, hd, Lq=200, Lk=400, q_offset=q_offset)
    run_case(libs, "sliding", torch.float16, hd, Lq=200, Lk=900, q_offset=q_offset)


@pytest.mark.parametrize("hd", HEAD_DIMS)
@pytest.mark.parametrize("name", ["alibi_doc", "bias2d_pad"])
def test_fully_masked_rows(libs, name, hd):
    # alibi_doc: the queries (q_idx >= Lk) sit in a document of their own, so the classifier finds every
    # tile EMPTY and the kernel visits none; bias2d_pad: every key is padding, tiles visited, all masked.
    q_offset = 170 if name == "alibi_doc" else 0
    run_case(libs, name, torch.bfloat16, hd, Lq=90, Lk=170, q_offset=q_offset, all_masked=True)


@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_documents_long(libs, hd):
    # sorted documents: EMPTY tiles skipped (also before the first visited one), FULL and PARTIAL tiles
    run_case(libs, "alibi_doc", torch.bfloat16, hd, B=1, Hq=2, Hkv=2, Lq=1000, Lk=1500, q_offset=500, seed=3)
    run_case(libs, "alibi_doc", torch.float16, hd, B=1, Hq=2, Hkv=1, Lq=700, Lk=700, q_offset=0, seed=4)


@pytest.mark.parametrize("hd", HEAD_DIMS)
def test_without_lse_and_scale(libs, hd):
    run_case(libs, "full", torch.float16, hd, Lq=100, Lk=100, return_lse=False, scale=0.3)
    run_case(libs, "softcap", torch.bfloat16, hd, Lq=100, Lk=100, scale=1.0)  # large scores: cap matters


def check_empty_kv(lib):
    """No keys at all: every row is fully masked, O = 0 and LSE = -inf (shared with the sm90 suite)."""
    from attngen import runtime

    q = torch.randn(1, 2, 5, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 0, 64, device="cuda", dtype=torch.bfloat16)
    out, lse = runtime.forward(lib, q, k, k, return_lse=True)
    torch.cuda.synchronize()
    assert (out == 0).all() and torch.isneginf(lse).all()
    return q, k


def test_empty_kv(libs):
    from attngen import runtime

    lib = libs("full", torch.bfloat16, 64)
    q, k = check_empty_kv(lib)
    out = runtime.forward(lib, q[:, :, :0], k, k)
    assert out.shape == (1, 2, 0, 64)


def check_side_stream(lib):
    """A launch on a side stream (torch's current stream there) gives what the default stream gives:
    deterministic kernel, same inputs. Shared with the sm90 suite."""
    from attngen import runtime

    q = torch.randn(2, 4, 300, lib.head_dim, device="cuda", dtype=lib.dtype)
    ref = runtime.forward(lib, q, q, q)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = runtime.forward(lib, q, q, q)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


def test_on_side_stream(libs):
    check_side_stream(libs("causal", torch.bfloat16, 128))


def test_input_errors_before_launch(libs):
    from attngen import runtime
    from attngen.errors import InputError

    lib = libs("full", torch.bfloat16, 64)
    q = torch.randn(1, 4, 16, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(InputError, match="float16"):
        runtime.forward(lib, q.float(), q.float(), q.float())
    with pytest.raises(InputError, match="one dtype"):
        runtime.forward(lib, q, q.half(), q)
    with pytest.raises(InputError, match="CUDA"):
        runtime.forward(lib, q.cpu(), q.cpu(), q.cpu())
    with pytest.raises(InputError, match="rank 4"):
        runtime.forward(lib, q[0], q[0], q[0])
    with pytest.raises(InputError, match="64, 128, 256"):
        x = torch.randn(1, 4, 16, 96, device="cuda", dtype=torch.bfloat16)
        runtime.forward(lib, x, x, x)
    with pytest.raises(InputError, match="multiple"):
        runtime.forward(lib, q, q[:, :3], q[:, :3])
    with pytest.raises(InputError, match="batch"):
        runtime.forward(lib, q, torch.cat([q, q]), torch.cat([q, q]))
    with pytest.raises(InputError, match="contiguous"):
        x = torch.randn(1, 4, 16, 128, device="cuda", dtype=torch.bfloat16)[..., ::2]
        runtime.forward(lib, x, x, x)
    with pytest.raises(InputError, match="captured tensor #0"):
        runtime.forward(lib, q, q, q, captured=[torch.zeros(3)])
    with pytest.raises(InputError, match="head dim 128"):
        x = torch.randn(1, 4, 16, 128, device="cuda", dtype=torch.bfloat16)
        runtime.forward(lib, x, x, x)
