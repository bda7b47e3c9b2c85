"""attngen.reference.attention against the test suite's float64 golden (tests/reference64.py).

The golden is written independently of attngen.reference: dense (B, Hq, Lq, Lk) scores in float64, the mods
evaluated once on broadcast index tensors (no chunking, no checkpointing), GQA by repeat_interleave and the
softmax by hand. It is itself checked against torch.softmax / SDPA where those apply.
"""
import math
import zlib

import pytest
import torch

import attngen.variants as V
from attngen.errors import InputError
from attngen.mods import MaskMod, ScoreMod, Variant, compose
from attngen.reference import attention, dense_mask, mask_density

import reference64
from helpers import assert_lse_close, rand_qkv

NEG_INF = float("-inf")



@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: intra-op threads only add contention (10x slower on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

# ---------------------------------------------------------------- the float64 golden

def golden(q, k, v, variant=None, scale=None, q_offset=0):
    """Dense float64 attention of the test suite (tests/reference64.py): (out float64, lse float64)."""
    return reference64.attention(q, k, v, variant, scale=scale, q_offset=q_offset)


# ---------------------------------------------------------------- variants under test
# Each builder gets (B, Hq, npos, gen): npos is the number of absolute positions a captured table must cover.

def _doc1(B, Hq, npos, gen):
    return V.document(torch.randint(0, 4, (npos,), generator=gen).sort().values.to(torch.int32))


def _doc2(B, Hq, npos, gen):
    return V.document(torch.randint(0, 3, (B, npos), generator=gen).sort(dim=1).values)


def _slopes(B, Hq, npos, gen):
    return V.alibi(torch.rand(Hq, generator=gen, dtype=torch.float64) * 0.5 + 0.05)


def _bias_mod(B, Hq, npos, gen):
    bias = torch.randn(Hq, 5, generator=gen, dtype=torch.float64)
    return ScoreMod(lambda s, b, h, q, kv: s + bias[h, (q - kv) % 5], "bias[h,(q-kv)%5]")


def _where_inf(B, Hq, npos, gen):
    # a score_mod that masks by returning -inf (score-dependent and index-dependent)
    return ScoreMod(lambda s, b, h, q, kv: torch.where((s > -0.7) & (kv <= q + 2), s, NEG_INF), "where_inf")


VARIANTS = {
    "full": lambda *a: None,
    "causal": lambda *a: V.causal(),
    "sliding_window": lambda *a: V.sliding_window(7),
    "local": lambda *a: V.local(5, 3),
    "local_left_open": lambda *a: V.local(None, 4),
    "local_right_open": lambda *a: V.local(6, None),
    "softcap": lambda *a: V.softcap(1.5),
    "alibi": lambda B, Hq, n, g: V.alibi(Hq),
    "alibi_slopes": _slopes,
    "prefix_lm": lambda *a: V.prefix_lm(9),
    "chunked": lambda *a: V.chunked(8),
    "document_1d": _doc1,
    "document_2d": _doc2,
    "block_diagonal": lambda *a: V.block_diagonal(6),
    "dilated": lambda *a: V.dilated(11, 3),
    # combinations
    "causal&document": lambda *a: V.causal() & _doc1(*a),
    "sliding_window|prefix_lm": lambda *a: V.sliding_window(4) | V.prefix_lm(5),
    "softcap+alibi": lambda B, Hq, n, g: compose(V.softcap(2.0), V.alibi(Hq)),
    "alibi>softcap+causal": lambda B, Hq, n, g: Variant(score_mod=V.alibi(Hq).then(V.softcap(2.0)), mask_mod=V.causal()),
    "local&~block_diagonal": lambda *a: V.local(10, 3) & ~V.block_diagonal(4),
    "chunked|dilated": lambda *a: V.chunked(5) | V.dilated(20, 4),
    "softcap+document2d": lambda *a: Variant(score_mod=V.softcap(1.0), mask_mod=_doc2(*a)),
    "custom_bias": _bias_mod,
    "custom_where_inf": _where_inf,
    "plain_function_variant": lambda *a: Variant(mask_mod=lambda b, h, q, kv: (q + kv) % 3 != 1),
}


def seed_of(*parts):
    """A per-test seed that is stable across runs (unlike hash(), which is salted per process)."""
    return zlib.crc32(repr(parts).encode())


def build(name, B, Hq, npos, seed):
    gen = torch.Generator().manual_seed(seed)
    return VARIANTS[name](B, Hq, npos, gen)


# ---------------------------------------------------------------- the golden itself

def test_golden_matches_torch_softmax_and_sdpa():
    gen = torch.Generator().manual_seed(0)
    q, k, v = rand_qkv(gen, 2, 3, 3, 9, 9, 8, 5)
    out, lse = golden(q, k, v)
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v, atol=1e-12, rtol=0)
    torch.testing.assert_close(lse, torch.logsumexp(s, -1), atol=1e-12, rtol=0)
    out_c, _ = golden(q, k, v, V.causal())
    torch.testing.assert_close(out_c, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-12, rtol=0)


# ---------------------------------------------------------------- forward against the golden

@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("hkv,q_offset", [(2, 0), (1, 13)], ids=["gqa-off0", "mqa-off13"])
def test_forward_matches_float64_golden(name, hkv, q_offset):
    B, Hq, Lq, Lk, D, Dv = 2, 4, 37, 45, 16, 12  # Lq != Lk, neither a multiple of the chunk
    seed = seed_of(name, hkv, q_offset)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rand_qkv(gen, B, Hq, hkv, Lq, Lk, D, Dv)
    var = build(name, B, Hq, max(Lq + q_offset, Lk), seed)
    want_o, want_l = golden(q, k, v, var, q_offset=q_offset)
    for chunk in (None, 16, 1):
        out, lse = attention(q, k, v, var, return_lse=True, q_offset=q_offset, chunk=chunk)
        assert out.dtype == torch.float64 and lse.dtype == torch.float64
        assert out.shape == (B, Hq, Lq, Dv) and lse.shape == (B, Hq, Lq)
        torch.testing.assert_close(out, want_o, atol=1e-12, rtol=1e-12)
        assert_lse_close(lse, want_l, atol=1e-12, rtol=1e-12)
        assert torch.equal(out[torch.isneginf(lse)], torch.zeros_like(out[torch.isneginf(lse)]))


@pytest.mark.parametrize("name", ["full", "causal&document", "softcap+alibi", "sliding_window|prefix_lm", "dilated"])
def test_forward_float32_and_bf16_inputs(name):
    B, Hq, Hkv, Lq, Lk, D = 1, 4, 4, 33, 50, 32
    seed = seed_of(name)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rand_qkv(gen, B, Hq, Hkv, Lq, Lk, D, D)
    var = build(name, B, Hq, Lk + 17, seed)
    want_o, want_l = golden(q, k, v, var, q_offset=17)
    out, lse = attention(q.float(), k.float(), v.float(), var, return_lse=True, q_offset=17, chunk=8)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want_o, atol=2e-6, rtol=1e-5)
    assert_lse_close(lse, want_l, atol=2e-6, rtol=1e-5)
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    want_o, want_l = golden(qb, kb, vb, var, q_offset=17)  # same rounded inputs
    out, lse = attention(qb, kb, vb, var, return_lse=True, q_offset=17)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want_o, atol=1e-2, rtol=1e-2)  # bf16 output rounding
    assert_lse_close(lse, want_l, atol=1e-5, rtol=1e-5)  # lse stays fp32


def test_scale_and_return_types():
    gen = torch.Generator().manual_seed(5)
    q, k, v = rand_qkv(gen, 1, 2, 2, 10, 12, 8, 8)
    want_o, want_l = golden(q, k, v, V.causal(), scale=0.37)
    out = attention(q, k, v, V.causal(), scale=0.37)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, want_o, atol=1e-12, rtol=0)
    _, lse = attention(q, k, v, V.causal(), scale=0.37, return_lse=True)
    assert_lse_close(lse, want_l, atol=1e-12)


def test_compiled_object_with_variant_attribute_is_accepted():
    class Compiled:  # what attngen.compile(...) returns exposes .variant
        variant = Variant(score_mod=V.softcap(2.0), mask_mod=V.sliding_window(3))

    gen = torch.Generator().manual_seed(6)
    q, k, v = rand_qkv(gen, 1, 2, 1, 9, 9, 8, 8)
    torch.testing.assert_close(attention(q, k, v, Compiled()), golden(q, k, v, Compiled.variant)[0], atol=1e-12, rtol=0)


# ---------------------------------------------------------------- fully masked rows

def _rows_masked_mod():
    # rows with q % 3 == 0 keep nothing; head 1 keeps nothing at all; others causal
    return MaskMod(lambda b, h, q, kv: (q % 3 != 0) & (h != 1) & (q >= kv), "holes")


def test_fully_masked_rows_forward():
    gen = torch.Generator().manual_seed(7)
    q, k, v = rand_qkv(gen, 2, 4, 2, 20, 15, 8, 8, dtype=torch.float32)
    out, lse = attention(q, k, v, _rows_masked_mod(), return_lse=True, q_offset=2, chunk=6)
    keep_any = dense_mask(_rows_masked_mod(), 2, 4, 20, 15, q_offset=2).any(-1)
    assert (~keep_any).sum() > 20 and keep_any.sum() > 20
    assert torch.equal(out[~keep_any], torch.zeros_like(out[~keep_any]))  # exactly 0
    assert torch.isneginf(lse[~keep_any]).all()
    assert torch.isfinite(lse[keep_any]).all() and torch.isfinite(out).all()
    want_o, want_l = golden(q, k, v, _rows_masked_mod(), q_offset=2)
    torch.testing.assert_close(out.double(), want_o, atol=2e-6, rtol=1e-5)
    assert_lse_close(lse, want_l, atol=2e-6, rtol=1e-5)


def test_no_keys_at_all():
    gen = torch.Generator().manual_seed(8)
    q, k, v = rand_qkv(gen, 1, 2, 2, 4, 6, 8, 3, dtype=torch.float32)
    out, lse = attention(q, k, v, MaskMod(lambda b, h, q, kv: q < 0, "none"), return_lse=True)
    assert torch.equal(out, torch.zeros(1, 2, 4, 3)) and torch.isneginf(lse).all()
    out, lse = attention(q, k[:, :, :0], v[:, :, :0], return_lse=True)
    assert torch.equal(out, torch.zeros(1, 2, 4, 3)) and torch.isneginf(lse).all()
    out, lse = attention(q[:, :, :0], k, v, return_lse=True)
    assert out.shape == (1, 2, 0, 3) and lse.shape == (1, 2, 0)


# ---------------------------------------------------------------- gradients

def _grads(fn, inputs, go, gl):
    out, lse = fn()
    return torch.autograd.grad((out, lse), inputs, grad_outputs=(go, gl), allow_unused=False)


@pytest.mark.parametrize("name", ["causal&document", "softcap+alibi", "sliding_window", "alibi>softcap+causal",
                                  "custom_where_inf", "local&~block_diagonal", "full"])
@pytest.mark.parametrize("chunk", [None, 7], ids=["one-chunk", "checkpointed-chunks"])
def test_gradients_match_float64_golden(name, chunk):
    B, Hq, Hkv, Lq, Lk, D, Dv = 2, 4, 2, 19, 23, 8, 6
    seed = seed_of(name, "grad")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rand_qkv(gen, B, Hq, Hkv, Lq, Lk, D, Dv, requires_grad=True)
    go = torch.randn(B, Hq, Lq, Dv, generator=gen, dtype=torch.float64)
    gl = torch.randn(B, Hq, Lq, generator=gen, dtype=torch.float64)
    var = build(name, B, Hq, Lq + 4 + Lk, seed)
    got = _grads(lambda: attention(q, k, v, var, return_lse=True, q_offset=4, chunk=chunk), (q, k, v), go, gl)
    want = _grads(lambda: golden(q, k, v, var, q_offset=4), (q, k, v), go, gl)
    for g, w, n in zip(got, want, "qkv"):
        assert not torch.isnan(g).any(), n
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10, msg=lambda m: f"d{n}: {m}")


def test_gradients_float32_close_to_float64():
    gen = torch.Generator().manual_seed(21)
    q, k, v = rand_qkv(gen, 1, 4, 1, 30, 30, 16, 16, requires_grad=True)
    go = torch.randn(1, 4, 30, 16, generator=gen, dtype=torch.float64)
    gl = torch.randn(1, 4, 30, generator=gen, dtype=torch.float64)
    var = Variant(score_mod=V.softcap(2.0), mask_mod=V.causal())
    want = _grads(lambda: golden(q, k, v, var), (q, k, v), go, gl)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    got = _grads(lambda: attention(qf, kf, vf, var, return_lse=True, chunk=8), (qf, kf, vf), go.float(), gl.float())
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g.double(), w, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk", [None, 4])
def test_gradients_fully_masked_rows_no_nan(chunk):
    gen = torch.Generator().manual_seed(9)
    q, k, v = rand_qkv(gen, 2, 4, 2, 14, 11, 8, 8, requires_grad=True)
    go = torch.randn(2, 4, 14, 8, generator=gen, dtype=torch.float64)
    gl = torch.randn(2, 4, 14, generator=gen, dtype=torch.float64)
    got = _grads(lambda: attention(q, k, v, _rows_masked_mod(), return_lse=True, chunk=chunk), (q, k, v), go, gl)
    want = _grads(lambda: golden(q, k, v, _rows_masked_mod()), (q, k, v), go, gl)
    keep_any = dense_mask(_rows_masked_mod(), 2, 4, 14, 11).any(-1)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)
    # a fully masked query row gets no gradient
    assert torch.equal(got[0][~keep_any], torch.zeros_like(got[0][~keep_any]))
    # also through plain .backward() of the output only, in float32
    qf = q.detach().float().requires_grad_()
    attention(qf, k.detach().float(), v.detach().float(), _rows_masked_mod(), chunk=chunk).sum().backward()
    assert torch.isfinite(qf.grad).all()


@pytest.mark.parametrize("chunk", [None, 5])
def test_gradient_reaches_captured_tensor(chunk):
    gen = torch.Generator().manual_seed(10)
    q, k, v = rand_qkv(gen, 1, 3, 3, 12, 12, 8, 8)
    bias = torch.randn(3, 12, generator=gen, dtype=torch.float64, requires_grad=True)
    var = Variant(score_mod=ScoreMod(lambda s, b, h, qi, kv: s + bias[h, kv], "bias"), mask_mod=V.causal())
    go = torch.randn(1, 3, 12, 8, generator=gen, dtype=torch.float64)
    q.requires_grad_()
    (g_ref,) = torch.autograd.grad(golden(q, k, v, var)[0], bias, go)
    (g,) = torch.autograd.grad(attention(q, k, v, var, chunk=chunk), bias, go)
    torch.testing.assert_close(g, g_ref, atol=1e-12, rtol=1e-10)


# ---------------------------------------------------------------- dense_mask / mask_density

@pytest.mark.parametrize("name", [n for n in VARIANTS if n not in ("softcap", "alibi", "alibi_slopes", "full",
                                                                  "softcap+alibi", "custom_bias", "custom_where_inf")])
def test_dense_mask_matches_per_element_evaluation(name):
    B, H, Lq, Lk, off = 2, 2, 6, 9, 3
    var = build(name, B, H, Lq + off + Lk, 1)
    mm = var.mask_mod if isinstance(var, Variant) else var
    mm = mm if isinstance(mm, MaskMod) else MaskMod(mm)
    got = dense_mask(var, B, H, Lq, Lk, q_offset=off, chunk=4)
    want = torch.tensor([[[[bool(mm(torch.tensor(b), torch.tensor(h), torch.tensor(r + off), torch.tensor(c)))
                            for c in range(Lk)] for r in range(Lq)] for h in range(H)] for b in range(B)])
    assert torch.equal(got, want)
    assert mask_density(var, B, H, Lq, Lk, q_offset=off, chunk=4) == pytest.approx(want.float().mean().item())


def test_dense_mask_without_mask_is_all_true_and_density():
    assert dense_mask(V.softcap(3.0), 1, 2, 3, 4).all()
    assert dense_mask(None, 1, 1, 2, 2).shape == (1, 1, 2, 2)
    assert mask_density(V.causal(), 2, 3, 64, 64, chunk=10) == pytest.approx((64 * 65 / 2) / 64 ** 2)


# ---------------------------------------------------------------- input validation

def _qkv():
    gen = torch.Generator().manual_seed(12)
    return rand_qkv(gen, 2, 4, 2, 8, 8, 16, 16, dtype=torch.float32)


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda q, k, v: (q[0], k, v), ["q must be 4-D", "(4, 8, 16)", "transpose"]),
        (lambda q, k, v: (q, k[:1], v[:1]), ["batch", "2", "1"]),
        (lambda q, k, v: (q[:, :3], k, v), ["multiple of kv heads", "Hq=3", "Hkv=2"]),
        (lambda q, k, v: (q, k, v[:, :1]), ["same number of heads", "k 2", "v 1"]),
        (lambda q, k, v: (q, k, v[:, :, :5]), ["same sequence length", "k 8", "v 5"]),
        (lambda q, k, v: (q, k[..., :8], v), ["head_dim", "16", "8"]),
        (lambda q, k, v: (q, k.double(), v), ["one dtype", "torch.float64", ".to(torch.float32)"]),
        (lambda q, k, v: (q.long(), k.long(), v.long()), ["floating point", "torch.int64"]),
        (lambda q, k, v: (q.tolist(), k, v), ["torch.Tensor", "list"]),
    ],
)
def test_bad_inputs_raise_with_fix(mutate, words):
    q, k, v = mutate(*_qkv())
    with pytest.raises(InputError) as ei:
        attention(q, k, v, V.causal())
    for w in words:
        assert w in str(ei.value), f"{w!r} not in {ei.value}"


def test_bad_options_raise():
    q, k, v = _qkv()
    for kw, words in [({"chunk": 0}, ["chunk", "positive"]), ({"chunk": 2.5}, ["chunk"]),
                      ({"q_offset": -1}, ["q_offset", ">= 0"]), ({"q_offset": 1.5}, ["q_offset", "int"]),
                      ({"scale": "x"}, ["scale"])]:
        with pytest.raises(InputError) as ei:
            attention(q, k, v, **kw)
        for w in words:
            assert w in str(ei.value)
    with pytest.raises(TypeError, match="Variant"):
        attention(q, k, v, object())  # not a variant, a mod or a function
    with pytest.raises(InputError, match="bool tensor"):
        attention(q, k, v, MaskMod(lambda b, h, qi, kv: (qi >= kv) * 1, "int_mask"))


def test_mod_errors_mention_reference_path():
    q, k, v = _qkv()
    short = V.document(torch.zeros(4, dtype=torch.int32))  # too short for 8 positions
    with pytest.raises(IndexError) as ei:
        attention(q, k, v, short)
    notes = "".join(getattr(ei.value, "__notes__", []))
    if hasattr(ei.value, "add_note"):
        assert "document(4)" in notes and "cover every absolute position" in notes


# ---------------------------------------------------------------- cross-check with FlexAttention itself

@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", ["causal&document", "alibi>softcap+causal", "local&~block_diagonal", "prefix_lm",
                                  "dilated", "document_2d", "softcap"])
def test_semantics_match_flex_attention_eager(name):
    """Same mods through torch's own flex_attention (eager, CPU): pins the index/score conventions to flex's."""
    fa = pytest.importorskip("torch.nn.attention.flex_attention")
    B, Hq, Hkv, L, D = 2, 4, 2, 128, 16
    seed = seed_of(name, "flex")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = rand_qkv(gen, B, Hq, Hkv, L, L, D, D, dtype=torch.float32)
    var = build(name, B, Hq, L, seed)
    var = var if isinstance(var, Variant) else (Variant(mask_mod=var) if isinstance(var, MaskMod) else Variant(score_mod=var))
    bm = None
    if var.mask_mod is not None:
        bm = fa.create_block_mask(var.mask_mod.fn, B, Hq, L, L, device="cpu", BLOCK_SIZE=32)
    sm = var.score_mod.fn if var.score_mod is not None else None
    try:
        f_out, f_lse = fa.flex_attention(q, k, v, score_mod=sm, block_mask=bm, enable_gqa=True, return_lse=True)
    except Exception as e:  # flex's eager CPU path is not available in every build
        pytest.skip(f"flex_attention eager on CPU unavailable: {e}")
    out, lse = attention(q, k, v, var, return_lse=True, chunk=48)
    torch.testing.assert_close(out, f_out, atol=2e-5, rtol=1e-4)
    fin = torch.isfinite(lse)
    torch.testing.assert_close(lse[fin], f_lse[fin].float(), atol=2e-5, rtol=1e-5)
