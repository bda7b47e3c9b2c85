"""The FP8 forward on the H200 (issue 12): q, k, v in e4m3 with per-(batch, kv head) descale factors, bfloat16 out.

Judged as FlexAttention's tests judge bf16 kernels, with the rounding FP8 adds: the kernel's error against float64
attention on the dequantised inputs must stay within 2x the error of an eager float32 implementation that rounds P
to e4m3 the same way (P V on e4m3 P, the row sums from unrounded P, bf16 output). Outputs are poisoned (NaN) first;
variants, GQA, odd lengths, q_len != kv_len, q_offset, fully masked rows, no keys, the LSE, and the NaN a CUDA
descale <= 0 gives without score_mod.
"""

import pytest
import torch

import attngen
from attngen import fp8, launch
from attngen.errors import InputError
from attngen.launch import load_library
import fp8_cases
from fp8_cases import E4M3, SHAPES, eager_fp8, inputs, variants

pytestmark = pytest.mark.requires_sm90

DEV = "cuda"


def _within_twice_the_eager_error(attn, out, q8, k8, v8, ds, q_offset, scale=None):
    """The suite's criterion: out's error against float64 on the dequantised inputs within 2x the eager FP8 one's."""
    exact = fp8_cases.exact(attn, q8, k8, v8, ds, q_offset, scale)
    err = (out.double() - exact).abs().max().item()
    eager = (eager_fp8(attn, q8, k8, v8, ds, q_offset, scale).double() - exact).abs().max().item()
    assert err <= 2 * eager + 1e-4, (err, eager)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["full", "causal", "sliding_window", "softcap_causal", "alibi_causal", "document",
                                  "relpos_window"])
def test_fp8_forward_within_twice_the_eager_fp8_error(name, shape):
    B, Hq, Hkv, Lq, Lk, off = shape
    gen = torch.Generator().manual_seed(Lq * 7 + Lk)
    (q8, k8, v8), ds = inputs(gen, B, Hq, Hkv, Lq, Lk, device=DEV)
    attn = attngen.compile(**variants(DEV)[name])
    out = torch.full((B, Hq, Lq, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib = attn._load(E4M3, 128, torch.cuda.current_device(), None, load_library)
    kw = dict(captured=attn.captured_on(q8.device), summaries=attn._summaries.get(attn, attn.captured_on(q8.device),
                                                                                     lib, Lq, Lk, off)) \
        if attn.facts.captured else {}
    got, lse = fp8.forward(lib, q8, k8, v8, ds, q_offset=off, return_lse=True, out=out, params=attn._param_fields(),
                           **kw)
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
    exact, exact_lse = fp8_cases.exact(attn, q8, k8, v8, ds, off, return_lse=True)
    err = (out.double() - exact).abs().max().item()
    eager = (eager_fp8(attn, q8, k8, v8, ds, off).double() - exact).abs().max().item()
    assert err <= 2 * eager + 1e-4, (err, eager)
    fin = torch.isfinite(exact_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin].double() - exact_lse[fin]).abs().max().item() < 1e-3
    # the call users make gives the same bytes
    assert torch.equal(attn(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], q_offset=off), out)


def test_fp8_fully_masked_rows_and_no_keys_give_zeros():
    gen = torch.Generator().manual_seed(3)
    (q8, k8, v8), ds = inputs(gen, 1, 2, 2, 64, 64, device=DEV)
    attn = attngen.compile(mask_mod=lambda b, h, q, kv: (kv <= q) & (q >= 10))  # rows 0..9 keep nothing
    out, lse = attn(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], return_lse=True)
    assert (out[:, :, :10] == 0).all() and torch.isneginf(lse[:, :, :10]).all()
    assert torch.isfinite(out).all() and (out[:, :, 10:].abs().sum(-1) > 0).all()
    empty = q8.new_empty((1, 2, 0, 128))
    out0, lse0 = attngen.compile(causal=True)(q8, empty, empty, q_descale=ds[0], return_lse=True)
    assert (out0 == 0).all() and torch.isneginf(lse0).all()


@pytest.mark.parametrize("which", [1, 2])  # k_descale, v_descale
def test_fp8_cuda_descale_not_positive_gives_nan_not_a_quiet_result(which):
    gen = torch.Generator().manual_seed(4)
    (q8, k8, v8), ds = inputs(gen, 2, 2, 2, 128, 128, device=DEV)
    ds[which] = ds[which].clone()
    ds[which][1, 0] = -ds[which][1, 0]  # batch 1, kv head 0
    out, lse = attngen.compile(causal=True)(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2],
                                            return_lse=True)
    assert torch.isnan(out[1, 0]).all() and torch.isnan(lse[1, 0]).all()
    assert torch.isfinite(out[0]).all() and torch.isfinite(out[1, 1]).all() and torch.isfinite(lse[0]).all()


@pytest.mark.parametrize("scale", [-0.07, 0.0])
def test_fp8_scale_not_positive_is_the_exact_rewrite(scale):
    """Without score_mod the kernel refuses scale <= 0 and fp8.forward runs it on -q (the sign bit flipped) at |scale|,
    or q = 0 at scale 1: the same bytes as those calls made by hand."""
    gen = torch.Generator().manual_seed(6)
    (q8, k8, v8), ds = inputs(gen, 1, 2, 2, 100, 100, device=DEV)
    attn = attngen.compile(causal=True)
    got = attn(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], scale=scale)
    flipped = (q8.view(torch.uint8) ^ 0x80).view(E4M3) if scale < 0 else torch.zeros_like(q8.view(torch.uint8)).view(E4M3)
    want = attn(flipped, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], scale=-scale if scale < 0 else 1.0)
    assert torch.equal(got, want)
    _within_twice_the_eager_error(attn, got, q8, k8, v8, ds, 0, scale)


def test_fp8_short_keys_and_unaligned_v_strides():
    gen = torch.Generator().manual_seed(7)
    (q8, k8, v8), ds = inputs(gen, 2, 2, 2, 40, 5, device=DEV)  # Lk < 16: one partial group of V^T
    attn = attngen.compile(causal=True)
    out = attn(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], q_offset=3)
    _within_twice_the_eager_error(attn, out, q8, k8, v8, ds, 3)
    # v whose batch stride is not a multiple of 16 bytes: V^T is made from a contiguous copy, same bytes
    big = torch.zeros(2 * 2 * 5 * 128 + 8, dtype=torch.uint8, device=DEV)
    odd = torch.as_strided(big, (2, 2, 5, 128), (2 * 5 * 128 + 4, 5 * 128, 128, 1)).view(E4M3)
    odd.copy_(v8)
    assert torch.equal(attn(q8, k8, odd, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], q_offset=3), out)


def test_fp8_library_is_refused_by_the_16_bit_path():
    gen = torch.Generator().manual_seed(8)
    q8, k8, v8 = (torch.randn(1, 2, 64, 128, generator=gen).to(E4M3).to(DEV) for _ in range(3))  # descales of 1
    attn = attngen.compile(causal=True)
    lib = attn.library(E4M3, 128, torch.cuda.current_device())
    with pytest.raises(InputError, match="FP8 library"):
        launch.forward(lib, q8, k8, v8)
    out = attn(q8, k8, v8)  # after library(): still the FP8 path (V^T, descales of 1)
    _within_twice_the_eager_error(attn, out, q8, k8, v8, [torch.ones(1, 2, device=DEV)] * 3, 0)


def test_fp8_errors_name_the_fix():
    gen = torch.Generator().manual_seed(5)
    (q8, k8, v8), ds = inputs(gen, 1, 2, 2, 64, 64, device=DEV)
    with pytest.raises(InputError, match="sm80"):
        attngen.compile(causal=True, backend="sm80")(q8, k8, v8)
    with pytest.raises(InputError, match="float8_e4m3fn"):
        attngen.compile(causal=True)(q8, k8, v8.to(torch.bfloat16))
    strided = torch.empty(1, 2, 128, 64, dtype=torch.uint8, device=DEV).view(E4M3).transpose(2, 3)
    with pytest.raises(InputError, match="contiguous"):
        attngen.compile(causal=True)(strided, k8, v8)
    with pytest.raises(InputError, match=r"\(1, 2\)"):
        attngen.compile(causal=True)(q8, k8, v8, q_descale=torch.ones(3, device=DEV))


@pytest.mark.parametrize("Lk", [1, 37, 64, 333])
def test_fp8_library_transposes_v_as_the_torch_reference(Lk):
    gen = torch.Generator().manual_seed(Lk)
    v = (torch.randn(2, 3, Lk, 256, generator=gen) * 8).to(E4M3).to(DEV)[..., 64:192]  # rows 256 bytes apart
    lib = attngen.compile(causal=True)._load(E4M3, 128, torch.cuda.current_device(), None, load_library)
    want = fp8.v_transposed(v)
    got = fp8.v_transposed_on_gpu(lib, v)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    got = fp8.v_transposed_on_gpu(lib, v[:, :, :, :].transpose(0, 1).contiguous().transpose(0, 1))  # batch stride
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
