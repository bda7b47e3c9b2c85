"""attngen.variants: hand-checked masks and scores, equivalences, names, argument errors, traceability."""
import math
import operator

import pytest
import torch

import attngen.variants as V
from attngen.errors import AttngenError
from attngen.mods import MaskMod, ScoreMod, Variant, compose
from attngen.reference import dense_mask
from attngen.variants import VariantArgumentError


def M(rows):
    """A hand-written 0/1 matrix (list of strings) as a bool tensor."""
    return torch.tensor([[c == "1" for c in r] for r in rows])


def mask2d(mod, Lq, Lk, q_offset=0, B=1, H=1, b=0, h=0):
    return dense_mask(mod, B, H, Lq, Lk, q_offset=q_offset)[b, h]



@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: intra-op threads only add contention (10x slower on a busy machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

# ---------------------------------------------------------------- hand-checked masks

def test_causal_hand_checked():
    assert torch.equal(mask2d(V.causal(), 4, 4), M(["1000", "1100", "1110", "1111"]))
    # q_idx is absolute: rows 0..2 of a query block starting at position 2
    assert torch.equal(mask2d(V.causal(), 3, 5, q_offset=2), M(["11100", "11110", "11111"]))


def test_sliding_window_hand_checked():
    assert torch.equal(
        mask2d(V.sliding_window(2), 5, 5),
        M(["10000", "11000", "01100", "00110", "00011"]),
    )
    assert torch.equal(mask2d(V.sliding_window(1), 3, 3), torch.eye(3, dtype=torch.bool))


def test_local_hand_checked():
    # kv in [q - 1, q + 2]
    assert torch.equal(
        mask2d(V.local(1, 2), 5, 6),
        M(["111000", "111100", "011110", "001111", "000111"]),
    )
    # right unbounded: kv >= q - 1
    assert torch.equal(mask2d(V.local(1, None), 4, 4), M(["1111", "1111", "0111", "0011"]))
    # left unbounded: kv <= q + 1
    assert torch.equal(mask2d(V.local(None, 1), 4, 4), M(["1100", "1110", "1111", "1111"]))
    # with an offset the window follows absolute positions
    assert torch.equal(mask2d(V.local(0, 0), 2, 5, q_offset=3), M(["00010", "00001"]))


def test_prefix_lm_hand_checked():
    assert torch.equal(
        mask2d(V.prefix_lm(2), 5, 5),
        M(["11000", "11000", "11100", "11110", "11111"]),
    )


def test_chunked_hand_checked():
    assert torch.equal(
        mask2d(V.chunked(2), 5, 5),
        M(["10000", "11000", "00100", "00110", "00001"]),
    )


def test_block_diagonal_hand_checked():
    assert torch.equal(
        mask2d(V.block_diagonal(2), 5, 5),
        M(["11000", "11000", "00110", "00110", "00001"]),
    )


def test_dilated_hand_checked():
    # window 5 (q - kv in 0..4), every 2nd key
    assert torch.equal(
        mask2d(V.dilated(5, 2), 7, 7),
        M(["1000000", "0100000", "1010000", "0101000", "1010100", "0101010", "0010101"]),
    )


def test_document_1d_and_2d_hand_checked():
    ids = torch.tensor([0, 0, 1, 1, 1], dtype=torch.int32)
    want = M(["11000", "11000", "00111", "00111", "00111"])
    assert torch.equal(mask2d(V.document(ids), 5, 5), want)
    ids2 = torch.tensor([[0, 0, 1, 1, 1], [5, 6, 6, 6, 7]], dtype=torch.int64)
    m = dense_mask(V.document(ids2), 2, 3, 5, 5)
    assert torch.equal(m[0, 2], want)
    assert torch.equal(m[1, 0], M(["10000", "01110", "01110", "01110", "00001"]))
    # doc ids need not be sorted: only equality matters
    ids3 = torch.tensor([2, 9, 2, 9], dtype=torch.int16)
    assert torch.equal(mask2d(V.document(ids3), 4, 4), M(["1010", "0101", "1010", "0101"]))


def test_mask_combinators_hand_checked():
    ids = torch.tensor([0, 0, 0, 1, 1], dtype=torch.int32)
    m = V.causal() & V.document(ids)
    assert torch.equal(mask2d(m, 5, 5), M(["10000", "11000", "11100", "00010", "00011"]))
    m = V.dilated(4, 2) | V.block_diagonal(2)
    assert torch.equal(mask2d(m, 5, 5), M(["11000", "11000", "10110", "01110", "00101"]))
    m = ~V.causal()
    assert torch.equal(mask2d(m, 3, 3), M(["011", "001", "000"]))
    assert m.name == "~causal"
    assert (V.causal() & V.document(ids)).name == "(causal & document(5))"


# ---------------------------------------------------------------- equivalences on random sizes

@pytest.mark.parametrize("w", [1, 3, 8])
def test_window_equivalences(w):
    Lq, Lk, off = 19, 27, 5
    ref = dense_mask(V.sliding_window(w), 2, 3, Lq, Lk, q_offset=off)
    assert torch.equal(dense_mask(V.local(w - 1, 0), 2, 3, Lq, Lk, q_offset=off), ref)
    assert torch.equal(dense_mask(V.dilated(w, 1), 2, 3, Lq, Lk, q_offset=off), ref)
    causal = dense_mask(V.causal(), 2, 3, Lq, Lk, q_offset=off)
    assert torch.equal(dense_mask(V.local(None, 0), 2, 3, Lq, Lk, q_offset=off), causal)
    assert torch.equal(dense_mask(V.prefix_lm(0), 2, 3, Lq, Lk, q_offset=off), causal)
    chunk = dense_mask(V.chunked(w), 2, 3, Lq, Lk, q_offset=off)
    assert torch.equal(chunk, dense_mask(V.block_diagonal(w) & V.causal(), 2, 3, Lq, Lk, q_offset=off))


def test_masks_against_python_semantics():
    """Every library mask equals a direct Python evaluation of its definition, pair by pair."""
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 3, (40,), generator=gen).sort().values
    py = {
        "causal": (V.causal(), lambda q, k: q >= k),
        "sliding_window": (V.sliding_window(4), lambda q, k: k <= q < k + 4),
        "local": (V.local(3, 2), lambda q, k: q - 3 <= k <= q + 2),
        "prefix_lm": (V.prefix_lm(6), lambda q, k: k < 6 or q >= k),
        "chunked": (V.chunked(5), lambda q, k: q // 5 == k // 5 and q >= k),
        "document": (V.document(ids), lambda q, k: int(ids[q]) == int(ids[k])),
        "block_diagonal": (V.block_diagonal(7), lambda q, k: q // 7 == k // 7),
        "dilated": (V.dilated(9, 3), lambda q, k: 0 <= q - k < 9 and (q - k) % 3 == 0),
    }
    Lq, Lk, off = 13, 40, 20
    for name, (mod, f) in py.items():
        got = dense_mask(mod, 1, 1, Lq, Lk, q_offset=off)[0, 0]
        want = torch.tensor([[f(r + off, c) for c in range(Lk)] for r in range(Lq)])
        assert torch.equal(got, want), name


# ---------------------------------------------------------------- score mods

def test_softcap_values():
    s = torch.tensor([-100.0, -3.0, 0.0, 0.5, 7.0, 1e4], dtype=torch.float64)
    got = V.softcap(5)(s, 0, 0, 0, 0)
    assert torch.allclose(got, 5 * torch.tanh(s / 5), rtol=0, atol=1e-12)
    assert got.abs().max() < 5.0 + 1e-12
    assert V.softcap(30).name == "softcap(30)"
    assert V.softcap(2.5).name == "softcap(2.5)"


def test_alibi_slopes_hand_checked():
    H = 8
    mod = V.alibi(H)
    h = torch.arange(H).view(H, 1, 1)
    q = torch.arange(6).view(1, 6, 1)
    kv = torch.arange(6).view(1, 1, 6)
    score = torch.zeros(H, 6, 6, dtype=torch.float64)
    got = mod(score, 0, h, q, kv)
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(H)], dtype=torch.float64)  # 2^(-8(h+1)/8)
    want = slopes.view(H, 1, 1) * (kv - q)
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    # one hand-checked entry: h=0 (slope 1/2), q=3, kv=1: bias -1.0
    assert got[0, 3, 1].item() == pytest.approx(-1.0)
    # h = 2 of 4 heads: slope 2^(-6)
    assert V.alibi(4)(torch.tensor(1.0), 0, torch.tensor(2), torch.tensor(5), torch.tensor(1)).item() == pytest.approx(
        1.0 - 4 * 2.0 ** -6)


def test_alibi_on_integer_head_tensor_is_float():
    h = torch.arange(16, dtype=torch.int64).view(1, 16, 1, 1)
    q = torch.arange(4).view(1, 1, 4, 1)
    kv = torch.arange(4).view(1, 1, 1, 4)
    out = V.alibi(16)(torch.zeros(1, 16, 4, 4), 0, h, q, kv)
    assert out.dtype == torch.float32
    assert out[0, 15, 3, 0].item() == pytest.approx(-3 * 2.0 ** -8)
    h32 = h.to(torch.int32)
    assert torch.allclose(V.alibi(16)(torch.zeros(1, 16, 4, 4), 0, h32, q, kv), out)


def test_alibi_slopes_tensor():
    slopes = torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64)
    mod = V.alibi(slopes)
    assert mod.name == "alibi(slopes[3])"
    h = torch.arange(3).view(3, 1, 1)
    q = torch.arange(4).view(1, 4, 1)
    kv = torch.arange(5).view(1, 1, 5)
    score = torch.randn(3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got = mod(score, 0, h, q, kv)
    assert torch.allclose(got, score + slopes.view(3, 1, 1) * (kv - q))
    # the same slopes through alibi(num_heads) for a power of two agree
    geo = torch.tensor([2.0 ** (-8 * (i + 1) / 4) for i in range(4)])
    h4 = torch.arange(4).view(4, 1, 1)
    assert torch.allclose(V.alibi(geo)(score[:1].float(), 0, h4, q, kv), V.alibi(4)(score[:1].float(), 0, h4, q, kv))


def test_score_composition_order():
    a, c = V.alibi(2), V.softcap(1.0)
    s = torch.tensor([[3.0]])
    h, q, kv = torch.tensor(0), torch.tensor(4), torch.tensor(0)
    ac = compose(a, c)(s, 0, h, q, kv)  # alibi first, then softcap
    assert ac.item() == pytest.approx(math.tanh(3.0 - 4 * 2.0 ** -4))
    ca = c.then(a)(s, 0, h, q, kv)
    assert ca.item() == pytest.approx(math.tanh(3.0) - 4 * 2.0 ** -4)
    assert compose(a, None, c).name == "alibi(2)>softcap(1)"


def test_variant_names():
    ids = torch.zeros(8, dtype=torch.int32)
    names = {
        V.causal(): "causal",
        V.sliding_window(1024): "sliding_window(1024)",
        V.local(128, 0): "local(128, 0)",
        V.local(None, 4): "local(None, 4)",
        V.prefix_lm(2048): "prefix_lm(2048)",
        V.chunked(8192): "chunked(8192)",
        V.block_diagonal(64): "block_diagonal(64)",
        V.dilated(256, 4): "dilated(256, 4)",
        V.document(ids): "document(8)",
        V.document(ids.view(2, 4)): "document(2x4)",
        V.alibi(16): "alibi(16)",
        V.softcap(30.0): "softcap(30)",
    }
    for mod, name in names.items():
        assert mod.name == name
        assert isinstance(mod, (MaskMod, ScoreMod))
    assert Variant(score_mod=V.alibi(16), mask_mod=V.causal()).name == "alibi(16)+causal"


def test_ints_from_numpy_like_and_torch_scalars_accepted():
    assert V.sliding_window(torch.tensor(4)).name == "sliding_window(4)"
    assert V.chunked(8).name == "chunked(8)"


# ---------------------------------------------------------------- argument errors

@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: V.sliding_window(0), ["window", ">= 1", "sliding_window(1024)"]),
        (lambda: V.sliding_window(1.5), ["window", "int", "float"]),
        (lambda: V.sliding_window(True), ["window", "int", "bool"]),
        (lambda: V.sliding_window(None), ["window", "int"]),
        (lambda: V.local(-1, 0), ["left", ">= 0", "None"]),
        (lambda: V.local(0, -2), ["right", ">= 0", "None"]),
        (lambda: V.local("8", 0), ["left", "int", "str"]),
        (lambda: V.local(None, None), ["masks nothing", "mask_mod=None"]),
        (lambda: V.prefix_lm(-1), ["prefix", ">= 0"]),
        (lambda: V.chunked(0), ["size", ">= 1"]),
        (lambda: V.block_diagonal(-3), ["size", ">= 1"]),
        (lambda: V.dilated(0, 2), ["window", ">= 1"]),
        (lambda: V.dilated(8, 0), ["dilation", ">= 1"]),
        (lambda: V.softcap(0), ["cap", "> 0"]),
        (lambda: V.softcap(-30), ["cap", "> 0"]),
        (lambda: V.softcap(float("inf")), ["cap", "finite"]),
        (lambda: V.softcap("30"), ["cap", "number", "str"]),
        (lambda: V.softcap(torch.tensor(30.0)), ["cap", "number", "Tensor"]),
        (lambda: V.alibi(0), ["num_heads", ">= 1"]),
        (lambda: V.alibi(2.5), ["num_heads", "int"]),
        (lambda: V.alibi(torch.tensor([1, 2])), ["floating point", "slopes.float()"]),
        (lambda: V.alibi(torch.ones(2, 4)), ["1-D", "(2, 4)"]),
        (lambda: V.alibi(torch.ones(0)), ["1-D", "(0,)"]),
        (lambda: V.document([0, 0, 1]), ["torch.Tensor", "list", "torch.tensor"]),
        (lambda: V.document(torch.zeros(4)), ["integer dtype", "torch.float32", "to(torch.int32)"]),
        (lambda: V.document(torch.zeros(4, dtype=torch.bool)), ["integer dtype", "torch.bool"]),
        (lambda: V.document(torch.zeros(2, 3, 4, dtype=torch.int32)), ["1-D", "2-D", "(2, 3, 4)"]),
        (lambda: V.document(torch.zeros(0, dtype=torch.int32)), ["empty"]),
    ],
)
def test_bad_arguments_raise_with_fix(make, words):
    with pytest.raises(VariantArgumentError) as ei:
        make()
    msg = str(ei.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    # catchable as the generic library error and as the builtin kinds
    assert isinstance(ei.value, AttngenError)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, TypeError)


# ---------------------------------------------------------------- traceability

_ALLOWED_TORCH = {"tanh", "exp", "exp2", "log", "sigmoid", "abs", "minimum", "maximum", "clamp", "where", "__getitem__"}


class Sym:
    """A stand-in for the tracer's proxy: builds a string, refuses bool(), allows only the documented ops."""

    _attngen_symbolic = True

    def __init__(self, text):
        self.text = text

    def __bool__(self):
        raise AssertionError(f"bool() called on symbolic value {self.text} (and/or/not/if on an index?)")

    def __index__(self):
        raise AssertionError(f"int()/index used on symbolic value {self.text}")

    __int__ = __float__ = __index__

    def __iter__(self):
        raise AssertionError("iteration over a symbolic value")

    __hash__ = object.__hash__

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        assert name in _ALLOWED_TORCH, f"mod called torch function {name}, which the tracer does not support"
        if name == "__getitem__":
            t, idx = args
            assert isinstance(t, torch.Tensor), "only captured tensors may be indexed"
            idx = idx if isinstance(idx, tuple) else (idx,)
            assert all(isinstance(i, (Sym, int)) for i in idx), "index must be index expressions"
            return Sym(f"T{list(t.shape)}[{', '.join(_txt(i) for i in idx)}]")
        return Sym(f"{name}({', '.join(_txt(a) for a in args)})")


def _txt(x):
    return x.text if isinstance(x, Sym) else repr(x)


def _binop(sym, reflected=False):
    def f(self, other):
        if not isinstance(other, (Sym, int, float)):
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        return Sym(f"({_txt(a)} {sym} {_txt(b)})")

    return f


for _name, _sym in [("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"), ("floordiv", "//"),
                    ("mod", "%"), ("pow", "**"), ("and", "&"), ("or", "|")]:
    setattr(Sym, f"__{_name}__", _binop(_sym))
    setattr(Sym, f"__r{_name}__", _binop(_sym, reflected=True))
for _name, _sym in [("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="), ("eq", "=="), ("ne", "!=")]:
    setattr(Sym, f"__{_name}__", _binop(_sym))
Sym.__neg__ = lambda self: Sym(f"(-{self.text})")
Sym.__invert__ = lambda self: Sym(f"(~{self.text})")


def _all_library_mods():
    ids = torch.zeros(16, dtype=torch.int32)
    return [
        V.causal(), V.sliding_window(8), V.local(4, 2), V.local(None, 2), V.local(4, None), V.prefix_lm(3),
        V.chunked(4), V.document(ids), V.document(ids.view(2, 8)), V.block_diagonal(4), V.dilated(8, 2),
        V.softcap(30.0), V.alibi(16), V.alibi(torch.ones(16)),
        V.causal() & ~V.document(ids) | V.prefix_lm(2), V.softcap(3).then(V.alibi(4)),
    ]


@pytest.mark.parametrize("mod", _all_library_mods(), ids=lambda m: m.name)
def test_library_mods_trace_with_symbolic_proxies(mod):
    b, h, q, kv, s = Sym("b"), Sym("h"), Sym("q_idx"), Sym("kv_idx"), Sym("score")
    out = mod(s, b, h, q, kv) if isinstance(mod, ScoreMod) else mod(b, h, q, kv)
    assert isinstance(out, Sym), f"{mod.name} returned {out!r}, not an expression"
    if isinstance(mod, ScoreMod):
        assert "score" in out.text


def test_alibi_slope_is_symbolic_in_h():
    out = V.alibi(16)(Sym("score"), Sym("b"), Sym("h"), Sym("q"), Sym("kv"))
    assert "h" in out.text and "**" in out.text
    ids = torch.zeros(4, dtype=torch.int32)
    out = V.document(ids.view(1, 4))(Sym("b"), Sym("h"), Sym("q"), Sym("kv"))
    assert "[b, q]" in out.text and "[b, kv]" in out.text


def test_proxy_refuses_python_logic():
    """The stand-in proxy really catches `and`/`if` (so the test above can fail)."""

    def bad(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx and q_idx - kv_idx < 4

    with pytest.raises(AssertionError, match="bool"):
        MaskMod(bad)(Sym("b"), Sym("h"), Sym("q"), Sym("kv"))
    with pytest.raises(AssertionError, match="does not support"):
        torch.cumsum(Sym("x"), 0)
    assert operator.and_(Sym("a"), Sym("b")).text == "(a & b)"


def test_compile_runs_no_block_summary_for_cpu_tensors(monkeypatch):
    """The compile-time warm-up of block summaries is for CUDA tensors only (tests/gpu/test_gpu_api.py)."""
    import attngen
    import attngen.summaries as summaries

    calls = []
    blocks_of = summaries._blocks_of
    monkeypatch.setattr(summaries, "_blocks_of", lambda *a: calls.append(a) or blocks_of(*a))
    attn = attngen.compile(mask_mod=V.document(torch.zeros(300, dtype=torch.int32)))
    assert attn.facts.summaries and not calls
