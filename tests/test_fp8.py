"""The FP8 forward's CPU side (issue 12, attngen/fp8.py): the V^T permutation against the wgmma fragment layouts it
has to match (read from the kernel headers), the reference semantics (attention on the dequantised inputs), the
descale and input checks, the spec / tile policy, the kernel's rounding of P emulated against the GPU suite's
criterion (tests/fp8_cases.py), and (nvcc lane) the e4m3 library built without spills."""
import math
import re
from pathlib import Path

import pytest
import torch

import attngen
import fp8_cases
from attngen import fp8, reference
from attngen.errors import InputError
from attngen.jit import tiles

E4M3 = torch.float8_e4m3fn
TEMPLATES = Path(attngen.__file__).resolve().parent / "templates"


def _c_expr(text: str, pattern: str) -> str:
    m = re.search(pattern, text)
    assert m, pattern
    return m.group(1)


def test_v_permutation_matches_the_fragment_layouts_of_the_kernel():
    """Per thread (g, tig): pack_a_frags puts accumulator floats c[h], c[h+1], c[h+4], c[h+5] (h from the header) in
    bytes 0..3 of A register r of a k32 step. By the wgmma layouts (D/C: float f of a k32 group is row g + 8 ((f % 4)
    // 2), column 8 (f // 4) + 2 tig + f % 2; 8-bit A: byte i of register r is row g + 8 (r % 2), k = 16 (r // 2) +
    4 tig + i), every byte's row must be its float's row, and V^T's k position must hold the float's kv column:
    fp8_v_position (the header's) = fp8.v_position, and v_transposed places v's rows there."""
    wgmma = (TEMPLATES / "sm90_wgmma.cuh.j2").read_text()
    h_expr = _c_expr(wgmma, r"const int h = ([^;]+);").replace("/", "//")
    offsets = [int(x or 0) for x in re.findall(r"c\[h(?: \+ (\d+))?\]", _c_expr(wgmma, r"pack4_e4m3\((c\[h\][^)]*)\)"))]
    assert offsets == [0, 1, 4, 5]
    pos_expr = _c_expr((TEMPLATES / "fwd_sm90.cuh").read_text(), r"int fp8_v_position\(int col\) \{ return ([^;]+);")
    for col in range(16):
        assert eval(pos_expr, {"col": col}) == fp8.v_position(col)
    assert sorted(fp8.v_position(c) for c in range(16)) == list(range(16))
    for tig in range(4):
        for r in range(4):
            h = eval(h_expr, {"r": r})
            for i, off in enumerate(offsets):
                f = h + off
                row, col = 8 * ((f % 4) // 2), 8 * (f // 4) + 2 * tig + f % 2
                k = 16 * (r // 2) + 4 * tig + i
                assert row == 8 * (r % 2), (tig, r, i)
                assert 16 * (col // 16) + fp8.v_position(col % 16) == k, (tig, r, i)


@pytest.mark.parametrize("Lk", [1, 16, 37, 64])
def test_v_transposed_places_every_row_and_pads_with_zeros(Lk):
    gen = torch.Generator().manual_seed(Lk)
    v = (torch.randn(2, 3, Lk, 128, generator=gen) * 4).to(E4M3)
    vt = fp8.v_transposed(v.transpose(2, 3).contiguous().transpose(2, 3))  # any strides in
    L16 = -(-Lk // 16) * 16
    assert vt.shape == (2, 3, 128, L16) and vt.is_contiguous() and vt.dtype == E4M3
    vb, vtb = v.view(torch.uint8), vt.view(torch.uint8)
    seen = set()
    for c in range(Lk):
        p = 16 * (c // 16) + fp8.v_position(c % 16)
        assert torch.equal(vtb[:, :, :, p], vb[:, :, c, :]), c
        seen.add(p)
    rest = [p for p in range(L16) if p not in seen]
    assert (vtb[:, :, :, rest] == 0).all()


def _quantised(gen, B, Hq, Hkv, L, D=128):
    q, k, v = (torch.randn(B, h, L, D, generator=gen) for h in (Hq, Hkv, Hkv))
    return [t.to(E4M3) for t in (q, k, v)]


def test_reference_is_attention_on_the_dequantised_inputs_per_kv_head():
    gen = torch.Generator().manual_seed(0)
    q8, k8, v8 = _quantised(gen, 2, 4, 2, 19)
    qd, kd, vd = (torch.rand(2, 2, generator=gen) + 0.5 for _ in range(3))
    attn = attngen.compile(causal=True, softcap=20.0)
    out, lse = attn(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, return_lse=True, q_offset=3)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    rep = lambda d: d.repeat_interleave(2, 1)[:, :, None, None]  # noqa: E731  query head h reads kv head h // 2
    want, want_lse = reference.attention(q8.double() * rep(qd).double(), k8.double() * kd[:, :, None, None].double(),
                                         v8.double() * vd[:, :, None, None].double(), attn.variant, return_lse=True,
                                         q_offset=3)
    assert (out.double() - want).abs().max().item() <= 2 * 2 ** -8 * want.abs().max().item()
    assert (lse.double() - want_lse).abs().max().item() < 1e-4
    # numbers and broadcastable tensors are the same factors
    same = attn(q8, k8, v8, q_descale=2.0, k_descale=torch.tensor(0.5), return_lse=False, q_offset=3)
    assert torch.equal(same, attn(q8, k8, v8, q_offset=3))


def test_descale_checks_name_the_problem():
    gen = torch.Generator().manual_seed(1)
    q8, k8, v8 = _quantised(gen, 1, 2, 2, 8)
    attn = attngen.compile(causal=True)
    with pytest.raises(InputError, match=r"q_descale has shape \(3,\), expected \(1, 2\)"):
        attn(q8, k8, v8, q_descale=torch.ones(3))
    with pytest.raises(InputError, match="k_descale must be finite and > 0"):
        attn(q8, k8, v8, k_descale=torch.tensor([[1.0, -1.0]]))
    with pytest.raises(InputError, match="v_descale must be finite and > 0"):
        attn(q8, k8, v8, v_descale=float("nan"))
    with pytest.raises(InputError, match="floating-point"):
        attn(q8, k8, v8, v_descale=torch.ones(1, 2, dtype=torch.int32))
    with pytest.raises(InputError, match="must be None, a number"):
        attn(q8, k8, v8, q_descale=True)
    with pytest.raises(InputError, match="are for torch.float8_e4m3fn inputs"):
        attn(q8.float(), k8.float(), v8.float(), q_descale=1.0)
    # a 1-D factor of several elements could mean per batch or per kv head: refused
    with pytest.raises(InputError, match=r"q_descale has shape \(2,\)"):
        fp8.descale_block((torch.ones(2), None, None), 2, 2, torch.device("cpu"))
    block = fp8.descale_block((torch.tensor([[2.0], [3.0]]), torch.tensor([0.5]), None), 2, 3, torch.device("cpu"))
    assert block.shape == (3, 2, 3) and block[0].tolist() == [[2.0] * 3, [3.0] * 3] and (block[1] == 0.5).all()


def test_fp8_inputs_are_refused_by_varlen_and_with_kvcache():
    attn = attngen.compile(causal=True)
    x = torch.zeros(8, 2, 128).to(E4M3)
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(InputError, match="varlen does not take FP8"):
        attn.varlen(x, x, x, cu, cu)
    q, cache = torch.zeros(1, 2, 1, 128).to(E4M3), torch.zeros(1, 2, 16, 128).to(E4M3)
    with pytest.raises(InputError, match="with_kvcache does not take FP8"):
        attn.with_kvcache(q, cache, cache, cache_seqlens=torch.tensor([4], dtype=torch.int32))


def test_fp8_inputs_are_checked():
    gen = torch.Generator().manual_seed(2)
    q8, k8, v8 = _quantised(gen, 1, 2, 2, 8)
    attn = attngen.compile(causal=True)
    with pytest.raises(InputError, match="float8_e4m3fn"):
        attn(q8, k8, v8.to(torch.bfloat16))
    with pytest.raises(InputError, match="is on cpu, expected a CUDA tensor"):  # the kernel entry's shared check
        fp8.forward(_FakeFp8Library(), q8, k8, v8)
    with pytest.raises(InputError, match="head dim 128"):  # a CUDA call at head dim 64 stops at its spec
        attn.spec(E4M3, 64, "sm_90a")
    with pytest.raises(InputError, match="inference-only"):
        attn(q8.requires_grad_(True), k8, v8)


def test_fp8_spec_and_tiles():
    attn = attngen.compile(causal=True)
    spec = attn.spec(E4M3, 128, "sm_90a")
    assert spec.dtype == "float8_e4m3fn" and spec.kernel == "sm90" and "fp8" in spec.uri
    # BK 192 (V^T in 64-byte swizzle columns) first, then 128 (one 128-byte row)
    assert all(t.elem_bytes == 1 for t in spec.tile_choices())
    assert [t.block_k for t in spec.tile_choices()] == [192, 128, 128]
    assert all(t.smem_bytes(128) <= tiles.SM90_SMEM_LIMIT for t in tiles.SM90_FP8_LADDER)
    with pytest.raises(InputError, match="sm_90a"):
        attn.spec(E4M3, 128, "sm_80")
    with pytest.raises(InputError, match="head dim 128"):
        attn.spec(E4M3, 64, "sm_90a")
    with pytest.raises(InputError, match="sm90 forward only"):
        attn.spec(E4M3, 128, "sm_90a", kernel="sm80")


def _online_fp8(x, v, block_k, threshold, offset):
    """The FP8 kernel's arithmetic on float32 scores x in the log2 domain (fwd_sm90.cuh, softmax.cuh): kv tiles of
    block_k, a row max kept while a tile raises it by at most threshold, P = 2^(x - m + offset) rounded to e4m3 for
    P V, the row sums from unrounded P; bf16 out."""
    m = torch.full((*x.shape[:-1], 1), -torch.inf)
    l, o = torch.zeros_like(m), torch.zeros(*x.shape[:-1], v.shape[-1])
    for j in range(0, x.shape[-1], block_k):
        xt = x[..., j:j + block_k]
        mx = torch.maximum(m, xt.amax(-1, keepdim=True))
        keep = (mx - m) <= threshold
        mx = torch.where(keep, m, mx)
        m_sub = torch.where(mx == -torch.inf, 0.0, mx)
        alpha = torch.where(keep, 1.0, torch.exp2(m - m_sub))
        p = torch.exp2(xt - m_sub + offset)
        l, o, m = l * alpha + p.sum(-1, keepdim=True), o * alpha + p.to(E4M3).float() @ v[..., j:j + block_k, :], mx
    return (o / l).nan_to_num(0.0).to(torch.bfloat16)


def _p_offset(threshold: float) -> int:
    """P_OFFSET of an FP8 build at this rescale threshold, from sm90_layout.cuh's expression."""
    expr = _c_expr((TEMPLATES / "sm90_layout.cuh").read_text(), r"constexpr int P_OFFSET = FP8 \? ([^:]+) :")
    assert expr == "8 - (int)RESCALE_THRESHOLD", expr
    return 8 - int(threshold)


@pytest.mark.parametrize("name", ["alibi_causal", "sliding_window"])
def test_fp8_p_rounding_stays_within_twice_the_eager_error(name):
    """The GPU suite's criterion (tests/gpu/test_fp8_gpu.py) on the kernel's arithmetic, emulated on the CPU at every
    rung of the FP8 ladder (their BK and rescale threshold) on one of its cases: within 2x (+1e-4) the error of eager
    attention that rounds P = e^(s - rowmax) to e4m3. A row max kept stale (threshold 8, no offset, BK 192: the ladder
    of session 16's round B) rounds the weight that dominates a peaked ALiBi row and fails it, as the GPU did."""
    B, Hq, Hkv, Lq, Lk, off = fp8_cases.SHAPES[1]
    (q8, k8, v8), ds = fp8_cases.inputs(torch.Generator().manual_seed(Lq * 7 + Lk), B, Hq, Hkv, Lq, Lk)
    attn = attngen.compile(**fp8_cases.variants()[name])
    exact = fp8_cases.exact(attn, q8, k8, v8, ds, off)
    eager = (fp8_cases.eager_fp8(attn, q8, k8, v8, ds, off).double() - exact).abs().max().item()
    s, v = fp8_cases.scores(attn, q8, k8, v8, ds, off)
    x = s / math.log(2)
    for t in tiles.SM90_FP8_LADDER:
        out = _online_fp8(x, v, t.block_k, t.rescale_threshold, _p_offset(t.rescale_threshold))
        assert (out.double() - exact).abs().max().item() <= 2 * eager + 1e-4, (t, eager)
    if name == "alibi_causal":
        stale = _online_fp8(x, v, 192, 8.0, 0)
        assert (stale.double() - exact).abs().max().item() > 2 * eager + 1e-4


def test_fp8_p_offset_keeps_small_weights_out_of_e4m3_subnormals():
    """Weights 2^-9.3 of the row max are e4m3 subnormals (below 2^-6) at offset 0, rounded to 2^-9 or 0; the header's
    offset of 8 at threshold 0 puts them at 2^-1.3, in e4m3's normal range. A row of one key at the max and 300 keys
    at -9.3 (log2 units) below it, with values 0 and 1: the offset's error is a small fraction of offset 0's."""
    x = torch.full((1, 1, 1, 301), -9.3)
    x[..., 0] = 0.0
    v = torch.ones(1, 1, 301, 8)
    v[:, :, 0] = 0.0
    w = torch.exp2(x.double())
    exact = (w @ v.double()) / w.sum(-1, keepdim=True)
    err = {offset: (_online_fp8(x, v, 192, 0.0, offset).double() - exact).abs().max().item()
           for offset in (0, _p_offset(0.0))}
    assert err[8] < 0.1 * err[0], err


@pytest.mark.requires_nvcc
@pytest.mark.parametrize("kw", [dict(), dict(causal=True, softcap=30.0)], ids=["full", "softcap_causal"])
def test_fp8_library_builds_without_spills_and_reports_e4m3(kw, tmp_path):
    from attngen.jit.ninja import LIBRARY_NAME
    from attngen.launch import load_library

    spec = attngen.compile(**kw).spec(E4M3, 128, "sm_90a")
    info = spec.build(tmp_path)
    assert info["spill_bytes"] == 0 and "elem_bytes=1" in info["tiles"]
    assert not (tmp_path / "attngen_decode.cu").exists()  # no KV-cache kernel for e4m3
    lib = load_library(tmp_path / LIBRARY_NAME)
    t = next(t for t in spec.tile_choices() if repr(t) == info["tiles"])  # the rung ptxas fitted
    assert (lib.dtype, lib.head_dim, lib.block_k, lib.smem_bytes) == (E4M3, 128, t.block_k, t.smem_bytes(128))
    with pytest.raises(InputError, match="FP8 library"):  # the 16-bit entry never reaches its kernel
        lib._fwd(b"", 0)
    assert lib._fwd_fp8 is not None and lib._fp8_v_transpose is not None


class _FakeFp8Library:
    """Stands in for an FP8 library on the CPU: records each packed AttngenFwdArgs and answers like the kernel (scale
    <= 0 refused without score_mod, as the sm90 kernel's attngen_fwd does), writing a marker into out and lse."""

    dtype, path, param_count, head_dim = E4M3, "fake-fp8", 0, 128
    captured_count = summary_count = 0

    def __init__(self):
        self.calls = []

    def _fwd_fp8(self, packed, stream):
        from attngen.abi import ERROR_SCALE_NOT_POSITIVE
        from attngen.launch import AttngenFwdArgs

        a = AttngenFwdArgs.from_buffer_copy(packed)
        self.calls.append(a)
        if a.scale <= 0:
            return ERROR_SCALE_NOT_POSITIVE
        return 0


@pytest.mark.parametrize("scale", [None, -0.25, 0.0])
def test_fp8_forward_packs_the_call_and_returns_its_outputs(monkeypatch, scale):
    """fp8.forward's host path on the CPU with a fake library (the device checks stubbed): the argument block names q,
    k, V^T, out, lse and the descale block with their strides, the scale rewrite flips q's sign bit (or zeroes q) and
    runs again at |scale| (or 1), and forward returns the tensors the kernel wrote, (out, lse) or out."""
    from attngen import launch

    monkeypatch.setattr(launch, "_check_qkv", lambda lib, q, k, v: None)
    monkeypatch.setattr(launch, "_capable_devices", {-1})
    monkeypatch.setattr(fp8, "call_on", lambda dev, entry, packed: entry(packed, 0))
    gen = torch.Generator().manual_seed(9)
    q8, k8, v8 = _quantised(gen, 2, 4, 2, 24)
    vt = fp8.v_transposed(v8)
    lib = _FakeFp8Library()
    qd = torch.tensor([[0.5, 0.25], [1.0, 2.0]])
    out, lse = fp8.forward(lib, q8, k8, v8, (qd, None, 3.0), scale=scale, return_lse=True, vt=vt)
    assert out.shape == (2, 4, 24, 128) and out.dtype == torch.bfloat16 and lse.shape == (2, 4, 24)
    first, last = lib.calls[0], lib.calls[-1]
    assert len(lib.calls) == (1 if scale is None else 2)
    assert (last.k, last.v, last.o, last.lse) == (k8.data_ptr(), vt.data_ptr(), out.data_ptr(), lse.data_ptr())
    assert list(last.v_stride) == list(vt.stride()[:3]) and list(last.k_stride) == list(k8.stride()[:3])
    assert (last.B, last.Hq, last.Hkv, last.Lq, last.Lk, last.D) == (2, 4, 2, 24, 24, 128)
    assert last.descale != 0 and first.descale == last.descale
    if scale is None:
        assert first.q == q8.data_ptr() and abs(first.scale - 128 ** -0.5) < 1e-7
    else:
        assert first.scale == pytest.approx(scale) and last.scale == pytest.approx(-scale if scale < 0 else 1.0)
        assert last.q != q8.data_ptr()
    assert fp8.forward(lib, q8, k8, v8, scale=scale, vt=vt).shape == (2, 4, 24, 128)  # out alone
