"""The FP8 forward on the H200 (issue 12): q, k, v in e4m3 with per-(batch, kv head) descale factors, bfloat16 out.

Judged as FlexAttention's tests judge bf16 kernels, with the rounding FP8 adds: the kernel's error against float64
attention on the dequantised inputs must stay within 2x the error of an eager float32 implementation that rounds P
to e4m3 the same way (P V on e4m3 P, the row sums from unrounded P, bf16 output). Outputs are poisoned (NaN) first;
variants, GQA, odd lengths, q_len != kv_len, q_offset, fully masked rows, no keys, the LSE, and the NaN a CUDA
descale <= 0 gives without score_mod.
"""
import math

import pytest
import torch

import attngen
from attngen import fp8, launch, reference
from attngen.errors import InputError
from attngen.launch import load_library

pytestmark = pytest.mark.requires_sm90

DEV = "cuda"
E4M3 = torch.float8_e4m3fn


def _inputs(gen, B, Hq, Hkv, Lq, Lk, D=128):
    """e4m3 q, k, v (values about randn / descale) and descales (B, Hkv) in [0.02, 0.06]."""
    q, k, v = (torch.randn(B, h, L, D, generator=gen) for h, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    ds = [torch.rand(B, Hkv, generator=gen) * 0.04 + 0.02 for _ in range(3)]
    q8, k8, v8 = ((t / d.repeat_interleave(t.shape[1] // Hkv, 1)[:, :, None, None]).to(E4M3)
                  for t, d in zip((q, k, v), ds))
    return [t.to(DEV) for t in (q8, k8, v8)], [d.to(DEV) for d in ds]


def _dequant(t, d):
    return t.double() * d.double().repeat_interleave(t.shape[1] // d.shape[1], 1)[:, :, None, None]


def _eager_fp8(attn, q8, k8, v8, ds, q_offset, scale=None):
    """float32 attention on the dequantised inputs with P rounded to e4m3 for P V (the kernel's rounding; the row
    sums from unrounded P), bf16 out."""
    _, sm, mm = reference._mods(attn.variant)
    q, k, v = (_dequant(t, d).float() for t, d in zip((q8, k8, v8), ds))
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    B, H, Lq, Lk = s.shape
    idx = reference._index_tensors(B, H, q_offset, q_offset + Lq, Lk, DEV)
    if sm is not None:
        s = reference._eval_score(sm, s, idx, "score_mod")
    if mm is not None:
        s = s.masked_fill(~reference._eval_mask(mm, idx, s.shape, DEV, "mask_mod"), -math.inf)
    m = s.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    p = torch.exp(s - m)
    o = (p.to(E4M3).float() @ v) / p.sum(-1, keepdim=True)
    return o.nan_to_num(0.0).to(torch.bfloat16)


def _within_twice_the_eager_error(attn, out, q8, k8, v8, ds, q_offset, scale=None):
    """The suite's criterion: out's error against float64 on the dequantised inputs within 2x the eager FP8 one's."""
    exact = reference.attention(*(_dequant(t, d) for t, d in zip((q8, k8, v8), ds)), attn.variant, scale=scale,
                                q_offset=q_offset)
    err = (out.double() - exact).abs().max().item()
    eager = (_eager_fp8(attn, q8, k8, v8, ds, q_offset, scale).double() - exact).abs().max().item()
    assert err <= 2 * eager + 1e-4, (err, eager)


def _variants():
    docs = (torch.arange(2048) // 150).to(DEV)
    return {
        "full": dict(),
        "causal": dict(causal=True),
        "sliding_window": dict(window=96),
        "softcap_causal": dict(softcap=20.0, causal=True),
        "alibi_causal": dict(score_mod=attngen.alibi(4), causal=True),
        "document": dict(mask_mod=attngen.document(docs)),
    }


SHAPES = [  # B, Hq, Hkv, Lq, Lk, q_offset
    (2, 4, 4, 256, 256, 0),
    (1, 4, 2, 200, 333, 133),   # GQA, odd lengths, q_len != kv_len: the queries are the last 200 positions
    (2, 4, 1, 77, 77, 0),       # MQA, one partial q tile, Lk not a multiple of 16
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["full", "causal", "sliding_window", "softcap_causal", "alibi_causal", "document"])
def test_fp8_forward_within_twice_the_eager_fp8_error(name, shape):
    B, Hq, Hkv, Lq, Lk, off = shape
    gen = torch.Generator().manual_seed(Lq * 7 + Lk)
    (q8, k8, v8), ds = _inputs(gen, B, Hq, Hkv, Lq, Lk)
    attn = attngen.compile(**_variants()[name])
    out = torch.full((B, Hq, Lq, 128), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib = attn._load(E4M3, 128, torch.cuda.current_device(), None, load_library)
    kw = dict(captured=attn.captured_on(q8.device), summaries=attn._summaries.get(attn, attn.captured_on(q8.device),
                                                                                     lib, Lq, Lk, off)) \
        if attn.facts.captured else {}
    got, lse = fp8.forward(lib, q8, k8, v8, ds, q_offset=off, return_lse=True, out=out, params=attn._param_fields(),
                           **kw)
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
    exact, exact_lse = reference.attention(*(_dequant(t, d) for t, d in zip((q8, k8, v8), ds)), attn.variant,
                                           return_lse=True, q_offset=off)
    err = (out.double() - exact).abs().max().item()
    eager = (_eager_fp8(attn, q8, k8, v8, ds, off).double() - exact).abs().max().item()
    assert err <= 2 * eager + 1e-4, (err, eager)
    fin = torch.isfinite(exact_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert (lse[fin].double() - exact_lse[fin]).abs().max().item() < 1e-3
    # the call users make gives the same bytes
    assert torch.equal(attn(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], q_offset=off), out)


def test_fp8_fully_masked_rows_and_no_keys_give_zeros():
    gen = torch.Generator().manual_seed(3)
    (q8, k8, v8), ds = _inputs(gen, 1, 2, 2, 64, 64)
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
    (q8, k8, v8), ds = _inputs(gen, 2, 2, 2, 128, 128)
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
    (q8, k8, v8), ds = _inputs(gen, 1, 2, 2, 100, 100)
    attn = attngen.compile(causal=True)
    got = attn(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], scale=scale)
    flipped = (q8.view(torch.uint8) ^ 0x80).view(E4M3) if scale < 0 else torch.zeros_like(q8.view(torch.uint8)).view(E4M3)
    want = attn(flipped, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2], scale=-scale if scale < 0 else 1.0)
    assert torch.equal(got, want)
    _within_twice_the_eager_error(attn, got, q8, k8, v8, ds, 0, scale)


def test_fp8_short_keys_and_unaligned_v_strides():
    gen = torch.Generator().manual_seed(7)
    (q8, k8, v8), ds = _inputs(gen, 2, 2, 2, 40, 5)  # Lk < 16: one partial group of V^T
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
    (q8, k8, v8), ds = _inputs(gen, 1, 2, 2, 64, 64)
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
