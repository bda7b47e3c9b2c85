"""The tracer: mods become sympy expressions; unsupported constructions raise with the fix."""
import math

import pytest
import sympy
import torch

import attngen
from attngen import symbols as S
from attngen import make_variant
from attngen.trace import trace


def _mask(fn):
    return trace(make_variant(mask_mod=fn))


def _score(fn):
    return trace(make_variant(score_mod=fn))


def test_two_spellings_one_canonical_text():
    a = _mask(lambda b, h, q, k: q >= k)
    b = _mask(lambda b, h, q, k: k <= q)
    c = _mask(lambda b, h, q, k: q - k > -1)
    assert a.canonical() == b.canonical() == c.canonical()
    s1 = _score(lambda s, b, h, q, k: 30 * torch.tanh(s / 30))
    s2 = _score(lambda s, b, h, q, k: 30.0 * math.tanh(s / 30.0))
    assert s1.canonical() == s2.canonical()


def test_different_constants_different_text():
    w = lambda n: _mask(attngen.sliding_window(n, specialize=True)).canonical()  # noqa: E731
    assert w(100) != w(101)
    assert _score(attngen.softcap(30, specialize=True)).canonical() != _score(attngen.softcap(31, specialize=True)).canonical()
    # runtime parameters are kernel arguments: one canonical text (one kernel) for every value
    assert _mask(attngen.sliding_window(100)).canonical() == _mask(attngen.sliding_window(101)).canonical()
    assert _score(attngen.softcap(30)).canonical() == _score(attngen.softcap(31)).canonical()


def test_where_neg_inf_is_hoisted_into_mask():
    t = _score(lambda s, b, h, q, k: torch.where(q >= k, s, float("-inf")))
    assert t.score == S.SCORE
    assert t.mask == _mask(lambda b, h, q, k: q >= k).mask
    # through an added bias too
    t2 = _score(lambda s, b, h, q, k: torch.where(q >= k, s, -math.inf) + (k - q) * 0.5)
    assert t2.mask == t.mask and not t2.score.has(-sympy.oo)
    # a score-dependent -inf stays in the score
    t3 = _score(lambda s, b, h, q, k: torch.where(s > 0, s, float("-inf")))
    assert t3.mask is sympy.true and t3.score.has(-sympy.oo)


def test_captured_tensors_are_runtime_inputs_keyed_by_dtype_and_rank():
    d1 = torch.tensor([0, 0, 1, 1])
    d2 = torch.tensor([5, 5, 5, 9, 9, 9])
    a, b = _mask(attngen.document(d1)), _mask(attngen.document(d2))
    assert a.canonical() == b.canonical()  # values never enter the key
    assert a.captured[0].tensor is d1
    c = _mask(attngen.document(d1.to(torch.int32)))
    assert c.canonical() != a.canonical()
    table = torch.randn(4, 64)
    t = _score(lambda s, b, h, q, k: s + table[h, q - k + 32])
    assert t.captured[0].rank == 2 and t.score.has(S.Load)


def test_supported_ops_trace():
    fns = [
        lambda s, b, h, q, k: torch.exp2(s) + torch.log2(torch.abs(s) + 1) + torch.sqrt(torch.abs(s)),
        lambda s, b, h, q, k: torch.rsqrt(s * s + 1) + torch.sigmoid(s) + torch.sin(s) * torch.cos(s),
        lambda s, b, h, q, k: torch.clamp(s, -5, 5) + torch.minimum(s, q * 1.0) + torch.maximum(s, k * 1.0),
        lambda s, b, h, q, k: s ** 2 - s / 3 + (q // 7) % 3 - abs(q - k),
        lambda s, b, h, q, k: torch.where((q % 2 == 0) & ~(k > q) | (h == 1), s, s * 0.5),
        lambda s, b, h, q, k: math.exp(s) + math.log(math.sqrt(abs(s) + 1)),
        lambda s, b, h, q, k: s.tanh() + s.exp(),
    ]
    for fn in fns:
        t = _score(fn)
        assert t.score.has(S.SCORE)


def _error(fn, kind="mask"):
    with pytest.raises(attngen.UnsupportedOperation) as e:
        (_mask if kind == "mask" else _score)(fn)
    return str(e.value)


def test_error_python_if():
    def m(b, h, q, k):
        if q > k:
            return True
        return False

    msg = _error(m)
    assert "if" in msg and "torch.where" in msg and "test_trace.py" in msg and "if q > k" in msg


def test_error_python_and():
    msg = _error(lambda b, h, q, k: q >= k and k > 0)
    assert "&" in msg


def test_error_builtin_min():
    msg = _error(lambda b, h, q, k: min(q, k) > 3)
    assert "torch.minimum" in msg


def test_error_unsupported_torch_op():
    msg = _error(lambda b, h, q, k: torch.fmod(q, 3) == 0)
    assert "torch.fmod" in msg and "%" in msg


def test_error_inplace():
    msg = _error(lambda s, b, h, q, k: s.add_(1), kind="score")
    assert "in-place" in msg


def test_error_list_indexing():
    lut = [1, 2, 3]
    msg = _error(lambda b, h, q, k: lut[q] > 0)
    assert "index a torch tensor" in msg


def test_error_whole_tensor():
    bias = torch.randn(8)
    msg = _error(lambda s, b, h, q, k: s + bias, kind="score")
    assert "bias[h]" in msg


def test_error_partial_indexing():
    table = torch.randn(4, 8)
    msg = _error(lambda s, b, h, q, k: s + table[h], kind="score")
    assert "index all 2 dimensions" in msg


def test_error_math_in_helper():
    def helper(x):
        return math.tanh(x)

    msg = _error(lambda s, b, h, q, k: helper(s), kind="score")
    assert "float()" in msg and "torch.tanh" in msg


def test_error_mask_returns_number():
    with pytest.raises(attngen.UnsupportedOperation, match="non-boolean"):
        _mask(lambda b, h, q, k: q - k)


def test_compiled_call_checks_q_offset():
    attn = attngen.compile(causal=True)
    q = torch.randn(1, 1, 4, 8)
    for bad in (-1, 1.5, True):
        with pytest.raises(attngen.InputError, match="q_offset"):
            attn(q, q, q, q_offset=bad)
    assert attn(q, q, q, q_offset=3).shape == q.shape


def test_bool_tensor_element_is_a_condition():
    valid = torch.tensor([True, False, True])
    t = _mask(lambda b, h, q, k: valid[k] & (q >= k))
    assert t.mask.has(S.ILoad) and t.captured[0].dtype == torch.bool


def test_unit_stride_dims_enter_the_key_and_the_generated_code():
    """A dim traced with stride 1 is indexed with a literal unit stride: a strided tensor of the same dtype
    and rank must get another cache key and other code (it once loaded the contiguous variant's library)."""
    from attngen.codegen import render_variant_inc

    base = torch.arange(16) // 4
    contiguous, strided = base[:8].clone(), base[::2]
    a, b = _mask(attngen.document(contiguous)), _mask(attngen.document(strided))
    assert a.captured[0].unit_stride_dims == (0,) and b.captured[0].unit_stride_dims == ()
    assert a.canonical() != b.canonical()
    inc_a = render_variant_inc(a, attngen.predicates.derive(a))
    inc_b = render_variant_inc(b, attngen.predicates.derive(b))
    assert "c.stride[0][0]" not in inc_a and "c.stride[0][0] * (long long)kv_idx" in inc_b
    table = torch.randn(8, 64)[::2]  # (4, 64): dim 0 stride 128, dim 1 contiguous
    t = _score(lambda s, b, h, q, k: s + table[h, q - k + 32])
    assert t.captured[0].unit_stride_dims == (1,)
