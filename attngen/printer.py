"""Sympy -> source printers: CUDA C++ (device code of ``variant.inc``) and Python/torch (vectorised evaluator).

One traversal, one table of renderings. ``_Printer`` walks a sympy expression, decides the C type of
every node (``bool``/``int``/``ll``/``float``), inserts the conversions Python's semantics imply and
asks ``OPS`` how to spell each operation. ``CudaPrinter`` and ``TorchPrinter`` override only the table
entries that differ (tinygrad style), so the two targets cannot drift apart in what they mean.

Semantics are Python's, evaluated in fp32 on the GPU:
  * integers stay integers: ``floor(a/b)`` of integer a, b is ``py_floordiv(a, b)`` and ``Mod`` is
    ``py_mod`` (sign of the divisor), never C's truncating ``/`` and ``%``;
  * a Rational coefficient or a negative power makes the node a float (Python's true division);
  * mixing ints and floats converts the int side to float (``(float)x``), like Python does.
Index math is 32-bit ``int`` (64-bit ``long long`` for int64 captured values, literals beyond int32
and captured-tensor offsets); the kernels' sequence lengths are far below 2**31.

The CUDA target reads captured tensors through ``CapturedArgs`` (``attngen_common.cuh``): element
``Load(t<N>, i0, i1, ..)`` is ``ag_ld_<dtype>(c.ptr[N], (long long)i0 * c.stride[N][0] + ..)``, a summary
``ILoad(s<N>, i)`` is ``((const int*)c.summary[N])[i]``. The ``ag_*`` device helpers printed calls
use (``ag_tanh``, ``ag_exp2``, ``ag_ld_bf16`` ...) are defined in ``templates/variant_math.cuh``, which
``variant.inc`` includes; being ``__forceinline__``, the ones an expression does not call cost nothing.
"""
from __future__ import annotations

import builtins
import keyword
import math
import struct
from collections import namedtuple
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import sympy
import torch
from sympy.logic.boolalg import BooleanAtom

from .errors import BuildError
from .symbols import B as _B, H as _H, KV as _KV, Q as _Q, ILoad, Load

__all__ = [
    "CudaPrinter",
    "TorchPrinter",
    "torch_function",
    "FloorDiv",
    "FlatLoad",
    "FlatILoad",
    "ToFloat",
    "WrapIndex",
    "CheckIndex",
    "lower_int_division",
    "BOOL",
    "INT",
    "LL",
    "FLOAT",
    "C_TYPES",
]

# ---------------------------------------------------------------------------------------------------------
# Extra nodes the code generator rewrites into before CSE/hoisting (and that the printers understand).


class FloorDiv(sympy.Function):
    """Python ``a // b`` of two integer expressions. Codegen rewrites ``floor(n/d)`` into this before
    CSE, so CSE cannot split the quotient into a float ``1/d`` temporary."""

    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer and b != 0:
            return sympy.Integer(int(a) // int(b))
        if b == 1:
            return a
        return None


class FlatLoad(sympy.Function):
    """FlatLoad(Symbol('t<N>'), offset): captured element at a precomputed element offset (64-bit),
    ``offset = sum(idx_d * stride_d)``. Codegen lowers Load into this so that the per-row and per-column
    parts of the offset can be hoisted like any other term."""

    is_real = True

    @classmethod
    def eval(cls, name, offset):
        return None


class FlatILoad(FlatLoad):
    is_integer = True


class ToFloat(sympy.Function):
    """float(x) of an integer expression. Codegen uses it to convert per-row / per-column integer terms
    to fp32 once, in the context structs, instead of once per element (exact below 2**24)."""

    is_real = True

    @classmethod
    def eval(cls, x):
        return None


class WrapIndex(sympy.Function):
    """WrapIndex(i, n): a captured-tensor index with torch's meaning of negative values, ``i + n`` if
    ``i < 0`` else ``i``, for a dimension of size ``n`` (an Integer). Codegen wraps the indices it cannot
    prove non-negative (CapturedTensor.wrapped_dims), so the kernel reads what CPU torch indexing reads."""

    is_integer = True

    @classmethod
    def eval(cls, i, n):
        if i.is_Integer and n.is_Integer:
            return i + n if i < 0 else i
        return None


class CheckIndex(sympy.Function):
    """CheckIndex(i, n, d, slot): index ``i`` of dim ``d`` of captured tensor ``n``, checked against the
    tensor's size in debug builds (ATTNGEN_DEBUG=1). The CUDA target prints ``ag_chk`` (variant_math.cuh),
    which reads the sizes from the bounds record in captured slot ``slot`` and, for an index out of range,
    records it there and returns 0 instead; the torch target prints the index unchanged."""

    is_integer = True

    @classmethod
    def eval(cls, i, n, d, slot):
        return None


def _unevaluated(func, args):
    """func(*args) without sympy's evaluation where the class takes ``evaluate=False``, else evaluated."""
    try:
        return func(*args, evaluate=False)
    except TypeError:
        return func(*args)


def lower_int_division(expr: sympy.Basic) -> sympy.Basic:
    """Rewrite ``floor(n/d)`` / ``ceiling(n/d)`` of integer n, d into ``FloorDiv`` (sympy assumptions
    decide integrality). Exact, and keeps the division atomic for CSE.

    Bottom up, once per distinct subexpression, and the parents of a rewritten node are rebuilt unevaluated:
    ``expr.replace`` re-evaluated every Max / Min above each rewrite, whose argument comparisons (assumption
    queries over the whole subtree) made this take a minute for a NATTEN-2D tile classifier. ``evaluate=False``
    goes to each constructor, not through sympy's ``evaluate(False)`` switch: that one clears sympy's cache, which
    other threads share, and lets them fetch unevaluated nodes from it (their CSE then recursed too deep)."""

    ints = {}

    def integer(e) -> bool:
        """Whether e is an integer by its structure (integer leaves under +, *, Max, Min, Piecewise, FloorDiv,
        floor, ceiling, Mod): sympy's own query expands Abs / Max / Min of the whole subtree."""
        hit = ints.get(e)
        if hit is None:
            if e.is_Atom or isinstance(e, (sympy.floor, sympy.ceiling, FloorDiv)):
                hit = e.is_integer is True
            elif isinstance(e, (sympy.Add, sympy.Mul, sympy.Max, sympy.Min, sympy.Mod)):
                hit = all(integer(a) for a in e.args)
            elif isinstance(e, sympy.Piecewise):
                hit = all(integer(x) for x, _ in e.args)
            else:
                hit = e.is_integer is True
            ints[e] = hit
        return hit

    def ratio(x):
        n, d = x.as_numer_denom()
        if d == 1 or not (integer(n) and integer(d)):
            return None
        return n, d

    done = {}

    def lower(e):
        hit = done.get(e)
        if hit is not None:
            return hit
        args = tuple(lower(a) for a in e.args)
        if isinstance(e, sympy.floor):
            r = ratio(args[0])
            out = FloorDiv(*r) if r else (e if args == e.args else e.func(*args))
        elif isinstance(e, sympy.ceiling):
            r = ratio(args[0])
            out = -FloorDiv(-r[0], r[1]) if r else (e if args == e.args else e.func(*args))
        elif args != e.args:
            out = _unevaluated(e.func, args)
        else:
            out = e
        done[e] = out
        return out

    return lower(sympy.sympify(expr))


# ---------------------------------------------------------------------------------------------------------
# Types and precedence

BOOL, INT, LL, FLOAT = "bool", "int", "ll", "float"
_RANK = {BOOL: 0, INT: 1, LL: 2, FLOAT: 3}
C_TYPES = {BOOL: "bool", INT: "int", LL: "long long", FLOAT: "float"}

P_TERN, P_OR, P_AND, P_EQ, P_REL, P_SHIFT, P_ADD, P_MUL, P_UNARY, P_ATOM = 10, 20, 30, 40, 50, 55, 60, 70, 80, 100

R = namedtuple("R", "text prec type")  # a rendered node

_INT32_MIN, _INT32_MAX = -(2**31) + 1, 2**31 - 1  # -2**31 itself is not an int literal in C
_INT64_MIN, _INT64_MAX = -(2**63) + 1, 2**63 - 1


def _positive_int(x) -> int:
    """x as a Python int if it is a positive integer constant below 2**31, else 0."""
    x = sympy.sympify(x)
    return int(x) if x.is_Integer and 0 < int(x) < 2**31 else 0


# b, h, q_idx and kv_idx are never negative in a kernel (q_idx includes the non-negative q offset)
_NONNEG_INDEX = {s: sympy.Symbol(s.name, integer=True, nonnegative=True) for s in (_B, _H, _Q, _KV)}


def _index_nonnegative(x) -> bool:
    return sympy.sympify(x).xreplace(_NONNEG_INDEX).is_nonnegative is True


def _arith(*types: str) -> str:
    """Result type of arithmetic over operands of these types (bool promotes to int, as in Python)."""
    return max((INT if t == BOOL else t for t in types), key=_RANK.__getitem__, default=INT)


# captured tensor dtype -> (helper suffix, value type)
_DTYPES = {
    torch.float32: ("f32", FLOAT),
    torch.float16: ("f16", FLOAT),
    torch.bfloat16: ("bf16", FLOAT),
    torch.float64: ("f64", FLOAT),
    torch.int32: ("i32", INT),
    torch.int64: ("i64", LL),
    torch.int16: ("i16", INT),
    torch.int8: ("i8", INT),
    torch.uint8: ("u8", INT),
    torch.bool: ("b8", INT),
}


def _norm_captured(captured) -> Dict[str, Tuple[int, Optional[torch.dtype]]]:
    """name -> (index, dtype). Accepts a name->dtype mapping (index = position) or CapturedTensor items."""
    if captured is None:
        return {}
    items = captured.items() if isinstance(captured, Mapping) else [(c.name, c.dtype) for c in captured]
    out = {}
    for n, (name, dt) in enumerate(items):
        if dt is not None and dt not in _DTYPES:
            raise BuildError(
                f"captured tensor {name!r} has dtype {dt}, which generated kernels cannot read; "
                f"supported: {', '.join(str(d) for d in _DTYPES)}. Convert it, e.g. tensor.to(torch.float32)"
            )
        out[name] = (n, dt)
    return out


def _norm_summaries(summaries) -> Dict[str, Tuple[int, bool]]:
    """name -> (index, integer). Accepts a name->integer mapping (index = position) or Summary items."""
    if summaries is None:
        return {}
    items = summaries.items() if isinstance(summaries, Mapping) else [(s.name, s.integer) for s in summaries]
    return {name: (n, bool(integer)) for n, (name, integer) in enumerate(items)}


def _f32_literal(v: float) -> str:
    """Shortest decimal that reads back as the fp32 rounding of ``v`` (``f`` suffix)."""
    try:
        f = struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return "INFINITY" if v > 0 else "-INFINITY"
    for digits in range(1, 10):
        s = f"{f:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(s)))[0] == f:
            break
    return repr(float(s)) + "f"


# ---------------------------------------------------------------------------------------------------------
# The shared traversal


class _Printer:
    """Walks sympy, types every node, and renders it through ``OPS`` (overridden per target).

    symbol_names: Symbol -> text to print (default: the symbol's name).
    local_types:  Symbol -> one of BOOL/INT/LL/FLOAT for symbols that carry no (or the wrong) sympy
                  assumptions, e.g. CSE temporaries (default: integer assumption -> INT, else FLOAT).
    captured:     name -> torch dtype (ordered: index = position), or a sequence of CapturedTensor.
    summaries:    name -> integer flag (ordered), or a sequence of Summary.
    """

    OPS: Dict[str, Callable] = {}
    TARGET = "?"

    def __init__(self, *, captured=None, summaries=None, symbol_names=None, local_types=None):
        self.captured = _norm_captured(captured)
        self.summaries = _norm_summaries(summaries)
        self.symbol_names: Dict[sympy.Symbol, str] = dict(symbol_names or {})
        self.local_types: Dict[sympy.Symbol, str] = dict(local_types or {})
        self._memo: Dict[sympy.Basic, R] = {}

    # -- public ----------------------------------------------------------------------------------------------
    def declare(self, sym: sympy.Symbol, type_: str, name: Optional[str] = None) -> None:
        """Give ``sym`` a type (and optionally the text to print for it)."""
        if type_ not in _RANK:
            raise ValueError(f"type must be one of {sorted(_RANK)}, got {type_!r}")
        self.local_types[sym] = type_
        if name is not None:
            self.symbol_names[sym] = name
        self._memo.clear()

    def doprint(self, expr, as_type: Optional[str] = None) -> str:
        """The expression as target source text, converted to ``as_type`` if given."""
        expr = sympy.sympify(expr)
        r = self._emit(expr) if as_type is None else self._emit_as(expr, as_type)
        return r.text

    def typeof(self, expr) -> str:
        """BOOL, INT, LL or FLOAT: the type the printed text has."""
        return self._emit(sympy.sympify(expr)).type

    # -- helpers -----------------------------------------------------------------------------------------------
    def op(self, name: str, *args) -> Tuple[str, int]:
        return self.OPS[name](self, *args)

    @staticmethod
    def par(r: R, prec: int) -> str:
        return r.text if r.prec >= prec else f"({r.text})"

    def _unsupported(self, e, why: str = "") -> BuildError:
        return BuildError(
            f"cannot print {type(e).__name__} node `{e}` for the {self.TARGET} target{': ' + why if why else ''}. "
            "Supported: + - * / // %, powers, floor/ceiling, Min/Max/Abs/sign, tanh/exp/exp2/expm1/log/log2/log1p/sqrt/"
            "sin/cos/tan/atan/erf, "
            "comparisons, & | ~, where (Piecewise) and captured-tensor loads; rewrite the mod with those."
        )

    def _lit(self, v, type_: str) -> R:
        if type_ == BOOL:
            return R(*self.op("bool", bool(v)), BOOL)
        if type_ == FLOAT:
            return R(*self.op("float", float(v)), FLOAT)
        v = int(v)
        if type_ == INT and not (_INT32_MIN <= v <= _INT32_MAX):
            type_ = LL
        if not (_INT64_MIN <= v <= _INT64_MAX):
            raise BuildError(f"integer constant {v} does not fit in 64 bits; use a smaller constant")
        return R(*self.op("int", v, type_), type_)

    def _to(self, r: R, type_: str) -> R:
        if r.type == type_:
            return r
        return R(*self.op("cast", r, type_), type_)

    def _emit_as(self, e: sympy.Basic, type_: str) -> R:
        if isinstance(e, BooleanAtom):
            return self._lit(bool(e), type_)
        if e.is_Integer and type_ != BOOL:
            return self._lit(int(e), type_)
        if e.is_Number and type_ == FLOAT:
            return self._number(e)
        return self._to(self._emit(e), type_)

    def _emit(self, e: sympy.Basic) -> R:
        r = self._memo.get(e)
        if r is None:
            r = self._emit_uncached(e)
            self._memo[e] = r
        return r

    def _emit_uncached(self, e: sympy.Basic) -> R:
        if isinstance(e, BooleanAtom):
            return self._lit(bool(e), BOOL)
        if isinstance(e, sympy.Symbol):
            return self._symbol(e)
        if isinstance(e, sympy.Expr) and (e.is_Number or e in (sympy.oo, -sympy.oo, sympy.nan, sympy.zoo)):
            return self._number(e)
        if isinstance(e, sympy.Expr) and not e.free_symbols and e.is_number:
            folded = self._fold(e)
            if folded is not None:
                return folded
        for cls in type(e).__mro__:
            m = getattr(self, "_e_" + cls.__name__, None)
            if m is not None:
                return m(e)
        raise self._unsupported(e)

    def _fold(self, e: sympy.Expr) -> Optional[R]:
        """A constant subexpression (log(2), pi, tanh(3)...) as one literal."""
        try:
            v = e.evalf(40)
        except Exception:  # noqa: BLE001 - sympy raises many types; print structurally instead
            return None
        if v.is_Integer:
            return self._lit(int(v), INT)
        if v in (sympy.oo, -sympy.oo, sympy.nan) or v.is_Float:
            return self._number(v)
        if v.is_real is False:
            raise BuildError(f"constant `{e}` is not real ({v}); a mod must produce real scores")
        return None

    def _number(self, e) -> R:
        if e.is_Integer:
            return self._lit(int(e), INT)
        if e is sympy.oo:
            return R(*self.op("float", math.inf), FLOAT)
        if e is -sympy.oo:
            return R(*self.op("float", -math.inf), FLOAT)
        if e is sympy.nan or e is sympy.zoo:
            return R(*self.op("float", math.nan), FLOAT)
        return R(*self.op("float", float(e)), FLOAT)  # Rational (Python true division) and Float

    def _symbol(self, e: sympy.Symbol) -> R:
        t = self.local_types.get(e)
        if t is None:
            t = INT if e.is_integer else FLOAT
        return R(*self.op("sym", self.symbol_names.get(e, e.name)), t)

    # -- arithmetic --------------------------------------------------------------------------------------------
    @staticmethod
    def _negative(term) -> bool:
        if term.is_Number:
            return term.is_negative is True
        if term.is_Mul:
            c = term.args[0]
            return c.is_Number and c.is_negative is True
        return False

    def _e_Add(self, e) -> R:
        terms = list(e.as_ordered_terms())
        # positive terms first, numbers last: `q_idx - kv_idx + 1`, not `-kv_idx + q_idx + 1`
        terms = (
            [t for t in terms if not t.is_Number and not self._negative(t)]
            + [t for t in terms if not t.is_Number and self._negative(t)]
            + [t for t in terms if t.is_Number]
        )
        types = [self._emit(t).type for t in terms]
        T = _arith(*types)
        if T == FLOAT:
            ints = [t for t, ty in zip(terms, types) if ty != FLOAT]
            if len(ints) >= 2:  # exact integer sum, converted once (Python would not round either)
                floats = [t for t, ty in zip(terms, types) if ty == FLOAT]
                terms = floats + [sympy.Add(*ints, evaluate=False)]
        parts = []
        for k, t in enumerate(terms):
            if k > 0 and self._negative(t):
                parts.append(("-", self._emit_as(-t, T)))
            else:
                parts.append(("+", self._emit_as(t, T)))
        return R(*self.op("add", parts), T)

    def _e_Mul(self, e) -> R:
        c, facs = e.as_coeff_mul()
        if c.is_negative:
            inner = self._emit(-e)
            return R(*self.op("neg", inner), inner.type)
        facs = list(facs)
        # log(x)/log(2) -> log2(x), log(x)/log(10) -> log10(x)
        special = []
        for base, fn in ((2, "log2"), (10, "log10")):
            inv = sympy.Pow(sympy.log(base), -1)
            if inv in facs:
                logs = [f for f in facs if isinstance(f, sympy.log)]
                if logs:
                    facs.remove(inv)
                    facs.remove(logs[0])
                    special.append(R(*self.op("call", fn, self._emit_as(logs[0].args[0], FLOAT)), FLOAT))
        num, den = [], []
        for f in facs:
            if f.is_Pow and f.exp.is_Integer and f.exp < 0:
                den.append(sympy.Pow(f.base, -f.exp))
            else:
                num.append(f)
        rnum = [self._emit(f) for f in num] + special
        is_float = bool(den) or not c.is_Integer or any(r.type == FLOAT for r in rnum)
        T = FLOAT if is_float else _arith(self._lit(c, INT).type, *(r.type for r in rnum))
        factors = []
        if c != 1 or not rnum:
            factors.append(self._lit(c, T) if c.is_Integer else self._number(c))
        factors += [self._to(r, T) for r in rnum]
        text, prec = self.op("mul", factors)
        if not den:
            return R(text, prec, T)
        dfactors = [self._emit_as(f, FLOAT) for f in den]
        d = R(*self.op("mul", dfactors), FLOAT) if len(dfactors) > 1 else dfactors[0]
        return R(*self.op("fdiv", R(text, prec, T), d), FLOAT)

    def _e_Pow(self, e) -> R:
        b, x = e.base, e.exp
        if x.is_Float and math.isfinite(float(x)) and float(x) == int(float(x)) and abs(float(x)) <= 64:
            x = sympy.Integer(int(float(x)))
            if x >= 0:
                return self._powi(self._emit_as(b, FLOAT), b, int(x))
        if x.is_Integer:
            n = int(x)
            rb = self._emit(b)
            if n == 0:
                return self._lit(1, INT if rb.type != FLOAT else FLOAT)
            if n > 0:
                return self._powi(rb if rb.type != BOOL else self._to(rb, INT), b, n)
            one = self._lit(1, FLOAT)
            denom = self._powi(self._to(rb, FLOAT), b, -n)
            return R(*self.op("fdiv", one, denom), FLOAT)
        if x in (sympy.Rational(1, 2), sympy.Float(0.5)):
            return R(*self.op("call", "sqrt", self._emit_as(b, FLOAT)), FLOAT)
        if x in (sympy.Rational(-1, 2), sympy.Float(-0.5)):
            return R(*self.op("call", "rsqrt", self._emit_as(b, FLOAT)), FLOAT)
        if b is sympy.E:
            return self._e_exp(sympy.exp(x, evaluate=False))
        if b.is_number and b.is_positive:
            rx = self._emit(x)
            if b == 2:
                if rx.type in (INT, LL) and x.is_nonnegative:  # Python: 2 ** nonneg int is an int
                    return R(*self.op("shl1", rx), rx.type)
                return R(*self.op("call", "exp2", self._to(rx, FLOAT)), FLOAT)
            return self._exp_base(float(b), x)
        return R(*self.op("call", "pow", self._emit_as(b, FLOAT), self._emit_as(x, FLOAT)), FLOAT)

    def _exp_base(self, base: float, x) -> R:
        """base ** x for a positive constant base other than 2 (target decides exp2 vs pow)."""
        return R(*self.op("call", "pow", self._lit(base, FLOAT), self._emit_as(x, FLOAT)), FLOAT)

    def _powi(self, rb: R, b, n: int) -> R:
        return R(*self.op("powi", rb, n, isinstance(b, sympy.Symbol)), rb.type)

    def _e_exp(self, e) -> R:
        return R(*self.op("call", "exp", self._emit_as(e.args[0], FLOAT)), FLOAT)

    def _e_log(self, e) -> R:
        if len(e.args) != 1:
            return self._emit(sympy.log(e.args[0]) / sympy.log(e.args[1]))
        return R(*self.op("call", "log", self._emit_as(e.args[0], FLOAT)), FLOAT)

    def _float_fn(name):  # noqa: N805 - helper building methods
        def m(self, e):
            return R(*self.op("call", name, *[self._emit_as(a, FLOAT) for a in e.args]), FLOAT)

        return m

    _e_tanh = _float_fn("tanh")
    _e_sin = _float_fn("sin")
    _e_cos = _float_fn("cos")
    _e_tan = _float_fn("tan")
    _e_asin = _float_fn("asin")
    _e_acos = _float_fn("acos")
    _e_atan = _float_fn("atan")
    _e_atan2 = _float_fn("atan2")
    _e_sinh = _float_fn("sinh")
    _e_cosh = _float_fn("cosh")
    _e_erf = _float_fn("erf")
    _e_log1p = _float_fn("log1p")
    _e_expm1 = _float_fn("expm1")
    del _float_fn

    def _e_sign(self, e) -> R:
        # torch.sign: -1, 0 or 1 in the argument's type (an int for an int index expression), NaN for NaN
        ra = self._emit(e.args[0])
        T = _arith(ra.type)
        return R(*self.op("sign", self._to(ra, T), T), T)

    def _int_ratio(self, x) -> Optional[Tuple[sympy.Expr, sympy.Expr]]:
        """x == n/d with integer-typed n, d (by this printer's typing), else None."""
        n, d = x.as_numer_denom()
        if d == 1:
            return None
        if self._emit(n).type in (INT, LL, BOOL) and self._emit(d).type in (INT, LL, BOOL):
            return n, d
        return None

    def _floordiv(self, n, d) -> R:
        rn, rd = self._emit(n), self._emit(d)
        T = _arith(rn.type, rd.type)
        if T == FLOAT:
            q = R(*self.op("div", self._to(rn, FLOAT), self._to(rd, FLOAT)), FLOAT)
            return R(*self.op("call", "floor", q), FLOAT)
        return R(*self.op("floordiv", self._emit_as(n, T), self._emit_as(d, T)), T)

    def _e_ToFloat(self, e) -> R:
        return self._emit_as(e.args[0], FLOAT)

    def _e_FloorDiv(self, e) -> R:
        return self._floordiv(*e.args)

    def _e_CheckIndex(self, e) -> R:
        i, n, d, slot = e.args
        return R(*self.op("chk", self._emit_as(i, LL), int(n), int(d), int(slot)), LL)

    def _e_WrapIndex(self, e) -> R:
        ri = self._emit(e.args[0])
        T = _arith(ri.type)
        if T == FLOAT:
            raise self._unsupported(e, "an index must be an integer expression")
        return R(*self.op("wrap", self._to(ri, T), self._lit(int(e.args[1]), T)), T)

    def _e_floor(self, e) -> R:
        a = e.args[0]
        ra = self._emit(a)
        if ra.type != FLOAT:
            return self._to(ra, _arith(ra.type))
        nd = self._int_ratio(a)
        if nd:
            return self._floordiv(*nd)
        return R(*self.op("call", "floor", ra), FLOAT)

    def _e_ceiling(self, e) -> R:
        a = e.args[0]
        ra = self._emit(a)
        if ra.type != FLOAT:
            return self._to(ra, _arith(ra.type))
        nd = self._int_ratio(a)
        if nd:
            q = self._floordiv(-nd[0], nd[1])
            return R(*self.op("neg", q), q.type)
        return R(*self.op("call", "ceil", ra), FLOAT)

    def _e_Mod(self, e) -> R:
        a, b = e.args
        T = _arith(self._emit(a).type, self._emit(b).type)
        name = "fmod" if T == FLOAT else "mod"
        return R(*self.op(name, self._emit_as(a, T), self._emit_as(b, T)), T)

    def _minmax(self, e, name) -> R:
        args = list(e.args)
        T = _arith(*(self._emit(a).type for a in args))
        acc = self._emit_as(args[-1], T)
        for a in reversed(args[:-1]):
            acc = R(*self.op(name, self._emit_as(a, T), acc, T), T)
        return acc

    def _e_Min(self, e) -> R:
        return self._minmax(e, "min")

    def _e_Max(self, e) -> R:
        return self._minmax(e, "max")

    def _e_Abs(self, e) -> R:
        ra = self._emit(e.args[0])
        T = _arith(ra.type)
        return R(*self.op("abs", self._to(ra, T), T), T)

    # -- booleans ----------------------------------------------------------------------------------------------
    def _e_Relational(self, e) -> R:
        if e.rel_op not in ("==", "!=", "<", "<=", ">", ">="):
            raise self._unsupported(e)
        ra, rb = self._emit(e.lhs), self._emit(e.rhs)
        T = BOOL if ra.type == rb.type == BOOL else _arith(ra.type, rb.type)
        return R(*self.op("cmp", e.rel_op, self._emit_as(e.lhs, T), self._emit_as(e.rhs, T)), BOOL)

    def _e_And(self, e) -> R:
        return R(*self.op("and", [self._emit_as(a, BOOL) for a in e.args]), BOOL)

    def _e_Or(self, e) -> R:
        return R(*self.op("or", [self._emit_as(a, BOOL) for a in e.args]), BOOL)

    def _e_Not(self, e) -> R:
        return R(*self.op("not", self._emit_as(e.args[0], BOOL)), BOOL)

    def _e_Xor(self, e) -> R:
        acc = self._emit_as(e.args[0], BOOL)
        for a in e.args[1:]:
            acc = R(*self.op("cmp", "!=", acc, self._emit_as(a, BOOL)), BOOL)
        return acc

    def _e_Implies(self, e) -> R:
        return self._emit(sympy.Or(sympy.Not(e.args[0]), e.args[1], evaluate=False))

    def _e_Equivalent(self, e) -> R:
        rs = [self._emit_as(a, BOOL) for a in e.args]
        return R(*self.op("and", [R(*self.op("cmp", "==", rs[0], r), BOOL) for r in rs[1:]]), BOOL)

    def _e_ITE(self, e) -> R:
        return self._e_Piecewise(sympy.Piecewise((e.args[1], e.args[0]), (e.args[2], True), evaluate=False))

    def _e_Piecewise(self, e) -> R:
        pairs = [(p.expr, p.cond) for p in e.args]
        vals = [self._emit(v) for v, _ in pairs]
        T = BOOL if all(r.type == BOOL for r in vals) else _arith(*(r.type for r in vals))
        if pairs[-1][1] is sympy.true:
            acc = self._emit_as(pairs[-1][0], T)
            pairs = pairs[:-1]
        elif T == FLOAT:  # sympy's value where no condition holds
            acc = self._lit(math.nan, FLOAT)
        else:
            raise self._unsupported(e, "a where/Piecewise without a default (True) branch has no value there")
        for v, cnd in reversed(pairs):
            acc = R(*self.op("where", self._emit_as(cnd, BOOL), self._emit_as(v, T), acc), T)
        return acc

    # -- loads -------------------------------------------------------------------------------------------------
    def _array(self, e):
        name = e.args[0]
        if not isinstance(name, sympy.Symbol):
            raise self._unsupported(e, "the first argument of a load must be the array's Symbol")
        return name.name

    def _unknown_array(self, e, name) -> BuildError:
        return BuildError(
            f"load `{e}` reads array {name!r}, which is neither a captured tensor "
            f"({', '.join(self.captured) or 'none'}) nor a summary ({', '.join(self.summaries) or 'none'}); "
            "pass its dtype in `captured=` (or its Summary in `summaries=`)"
        )

    def _e_Load(self, e) -> R:
        raise self._unsupported(e)

    def _e_FlatLoad(self, e) -> R:
        raise self._unsupported(e)


# ---------------------------------------------------------------------------------------------------------
# CUDA C++


def _c_int(p, v, t):
    s = f"{v}LL" if t == LL else str(v)
    return s, (P_ATOM if v >= 0 else P_UNARY)


def _c_float(p, v):
    if math.isnan(v):
        return "NAN", P_ATOM
    if math.isinf(v):
        return ("INFINITY", P_ATOM) if v > 0 else ("-INFINITY", P_UNARY)
    s = _f32_literal(v)
    return s, (P_UNARY if s.startswith("-") else P_ATOM)


def _c_cast(p, r, t):
    if t == BOOL:
        zero = "0.0f" if r.type == FLOAT else "0"
        return f"{p.par(r, P_REL)} != {zero}", P_EQ
    return f"({C_TYPES[t]}){p.par(r, P_UNARY)}", P_UNARY


def _c_neg(p, r):
    # -(a*b) == (-a)*b exactly, in ints and floats; but `-a * b` then is a product, not a unary
    t = p.par(r, P_MUL)
    if t.startswith("-"):
        return f"-({t})", P_UNARY
    return "-" + t, (P_UNARY if r.prec >= P_UNARY else P_MUL)


def _c_add(p, parts):
    out = p.par(parts[0][1], P_ADD)
    for sign, r in parts[1:]:
        out += f" {sign} {p.par(r, P_ADD + 1)}"
    return out, P_ADD


def _c_mul(p, rs):
    if len(rs) == 1:
        return rs[0].text, rs[0].prec
    return " * ".join([p.par(rs[0], P_MUL)] + [p.par(r, P_MUL + 1) for r in rs[1:]]), P_MUL


def _c_powi(p, r, n, atomic):
    if n == 1:
        return r.text, r.prec
    if atomic and n <= 4:
        return " * ".join([r.text] * n), P_MUL
    return f"ag_powi({r.text}, {n})", P_ATOM


def _c_call(p, name, *rs):
    return f"{p.FUNCS[name]}({', '.join(r.text for r in rs)})", P_ATOM


def _c_helper(name):
    def f(p, *args):
        *rs, _t = args
        return f"ag_{name}({', '.join(r.text for r in rs)})", P_ATOM

    return f


def _c_cmp(p, op, a, b):
    prec = P_EQ if op in ("==", "!=") else P_REL
    return f"{p.par(a, prec + 1)} {op} {p.par(b, prec + 1)}", prec


_C_OPS = {
    "int": _c_int,
    "float": _c_float,
    "bool": lambda p, v: ("true" if v else "false", P_ATOM),
    "sym": lambda p, name: (name, P_ATOM),
    "cast": _c_cast,
    "neg": _c_neg,
    "add": _c_add,
    "mul": _c_mul,
    "div": lambda p, a, b: (f"{p.par(a, P_MUL)} / {p.par(b, P_MUL + 1)}", P_MUL),
    "fdiv": lambda p, a, b: (f"{p.par(a, P_MUL)} / {p.par(b, P_MUL + 1)}", P_MUL),  # a score's true division
    # Python // and % by a positive constant, reduced (CudaPrinter): bit ops for powers of two, C's / and %
    # for a provably non-negative dividend; parenthesised because & and >> bind looser than == and +
    "bitand": lambda p, a, b: (f"({p.par(a, P_UNARY)} & {b.text})", P_ATOM),
    "shr": lambda p, a, k: (f"({p.par(a, P_UNARY)} >> {k})", P_ATOM),
    "cdiv": lambda p, a, b: (f"{p.par(a, P_MUL)} / {p.par(b, P_MUL + 1)}", P_MUL),
    "cmod": lambda p, a, b: (f"{p.par(a, P_MUL)} % {p.par(b, P_MUL + 1)}", P_MUL),
    "floordiv": lambda p, a, b: (f"py_floordiv({a.text}, {b.text})", P_ATOM),
    "mod": lambda p, a, b: (f"py_mod({a.text}, {b.text})", P_ATOM),
    "fmod": lambda p, a, b: (f"ag_fmod_py({a.text}, {b.text})", P_ATOM),
    "shl1": lambda p, r: (f"1 << {p.par(r, P_ADD)}", P_SHIFT),
    "powi": _c_powi,
    "call": _c_call,
    "min": _c_helper("min"),
    "max": _c_helper("max"),
    "abs": lambda p, r, t: (f"fabsf({r.text})", P_ATOM) if t == FLOAT else _c_helper("abs")(p, r, t),
    "sign": _c_helper("sign"),
    "cmp": _c_cmp,
    "and": lambda p, rs: (" && ".join(p.par(r, P_AND + 1) for r in rs), P_AND),
    "or": lambda p, rs: (" || ".join(p.par(r, P_AND + 1) for r in rs), P_OR),
    "not": lambda p, r: ("!" + p.par(r, P_UNARY), P_UNARY),
    "where": lambda p, c, a, b: (f"{p.par(c, P_TERN + 1)} ? {p.par(a, P_TERN + 1)} : {p.par(b, P_TERN + 1)}", P_TERN),
    "wrap": lambda p, i, n: (f"ag_wrap({i.text}, {n.text})", P_ATOM),  # i < 0 ? i + n : i
    "chk": lambda p, i, n, d, slot: (f"ag_chk({p.captured_var}.ptr[{slot}], {n}, {d}, {i.text})", P_ATOM),
}

_C_FUNCS = {
    "tanh": "tanhf", "exp": "expf", "exp2": "exp2f", "log": "logf", "log2": "log2f", "log10": "log10f",
    "sqrt": "sqrtf", "rsqrt": "ag_rsqrt", "sin": "sinf", "cos": "cosf", "tan": "tanf", "asin": "asinf",
    "acos": "acosf", "atan": "atanf", "atan2": "atan2f", "sinh": "sinhf", "cosh": "coshf", "erf": "erff",
    "pow": "powf", "floor": "floorf", "ceil": "ceilf", "log1p": "log1pf", "expm1": "expm1f",
}  # fmt: skip

_LOG2E = 1.0 / math.log(2.0)


class CudaPrinter(_Printer):
    """sympy -> CUDA C++ expression text (fp32 float math, Python integer semantics).

    fast_tanh: tanh via ``tanh.approx.f32`` (``ag_tanh``; ~2^-11 relative error) instead of ``tanhf``.
    fast_exp2: ``2**x`` via ``ex2.approx.ftz.f32`` (``ag_exp2``) and ``exp(x)`` as ``ag_exp2(x*log2(e))``,
               instead of ``exp2f``/``expf``/``powf``.
    ``captured_var``: the name of the ``const CapturedArgs&`` in scope where loads are printed.
    The printed text calls ``ag_*`` helpers of ``templates/variant_math.cuh``; include it before that text.
    """

    TARGET = "CUDA"
    OPS = _C_OPS

    def __init__(self, fast_tanh: bool = True, fast_exp2: bool = True, *, captured=None, summaries=None,
                 symbol_names=None, local_types=None, captured_var: str = "c", fast_div: bool = False):
        super().__init__(captured=captured, summaries=summaries, symbol_names=symbol_names, local_types=local_types)
        self.fast_tanh, self.fast_exp2, self.fast_div = fast_tanh, fast_exp2, fast_div
        self.captured_var = captured_var
        self.FUNCS = dict(_C_FUNCS)
        if fast_tanh:
            self.FUNCS["tanh"] = "ag_tanh"
        if fast_exp2:
            self.FUNCS["exp2"] = "ag_exp2"
        if fast_div:  # IEEE division is a multi-instruction sequence with a slow-path branch per element
            self.OPS = dict(self.OPS, fdiv=lambda p, a, b: (f"ag_fdiv({a.text}, {b.text})", P_ATOM))

    # Python's // and % by a positive constant without py_floordiv / py_mod's sign fix-ups: for 2**k a shift /
    # a bit mask (two's complement: exact for either sign), else C's truncating / and % where the dividend is
    # provably >= 0 (q_idx, kv_idx, b, h and their sums and products).
    def _e_Mod(self, e) -> R:
        a, b = e.args
        T = _arith(self._emit(a).type, self._emit(b).type)
        m = _positive_int(b)
        if T in (INT, LL) and m:
            ra = self._emit_as(a, T)
            if m & (m - 1) == 0:
                return R(*self.op("bitand", ra, self._lit(m - 1, T)), T)
            if _index_nonnegative(a):
                return R(*self.op("cmod", ra, self._lit(m, T)), T)
        return super()._e_Mod(e)

    def _floordiv(self, n, d) -> R:
        T = _arith(self._emit(n).type, self._emit(d).type)
        m = _positive_int(d)
        if T in (INT, LL) and m:
            rn = self._emit_as(n, T)
            if m & (m - 1) == 0:
                return R(*self.op("shr", rn, m.bit_length() - 1), T)
            if _index_nonnegative(n):
                return R(*self.op("cdiv", rn, self._lit(m, T)), T)
        return super()._floordiv(n, d)

    def _e_exp(self, e) -> R:
        if not self.fast_exp2:
            return super()._e_exp(e)
        c, rest = e.args[0].as_coeff_Mul()  # exp(c*x) = exp2(x * (c*log2 e)): one multiply
        k = self._lit(float(c) * _LOG2E, FLOAT)
        arg = R(*self.op("mul", [k, self._emit_as(rest, FLOAT)]), FLOAT) if rest != 1 else k
        return R(*self.op("call", "exp2", arg), FLOAT)

    def _exp_base(self, base: float, x) -> R:
        if not self.fast_exp2:
            return super()._exp_base(base, x)
        c, rest = sympy.sympify(x).as_coeff_Mul()
        k = self._lit(float(c) * math.log2(base), FLOAT)
        arg = R(*self.op("mul", [k, self._emit_as(rest, FLOAT)]), FLOAT) if rest != 1 else k
        return R(*self.op("call", "exp2", arg), FLOAT)

    def _load_fn(self, e, name) -> Tuple[int, str, str]:
        if name not in self.captured:
            raise self._unknown_array(e, name)
        n, dt = self.captured[name]
        if dt is None:
            dt = torch.int32 if isinstance(e, (ILoad, FlatILoad)) else torch.float32
        suffix, vt = _DTYPES[dt]
        return n, f"ag_ld_{suffix}", vt

    def _e_Load(self, e) -> R:
        name = self._array(e)
        idx = e.args[1:]
        if name in self.summaries:
            n, integer = self.summaries[name]
            if len(idx) != 1:
                raise self._unsupported(e, f"summary array {name!r} is 1-D, got {len(idx)} indices")
            ct = "int" if integer else "float"
            i = self._emit_as(idx[0], INT)
            return R(f"((const {ct}*){self.captured_var}.summary[{n}])[{i.text}]", P_ATOM, INT if integer else FLOAT)
        n, fn, vt = self._load_fn(e, name)
        if not 1 <= len(idx) <= 4:
            raise self._unsupported(e, f"captured tensors have 1 to 4 dimensions, got {len(idx)} indices")
        cv = self.captured_var
        terms = []
        for d, i in enumerate(idx):
            ri = self._emit(i)
            ri = self._to(ri, LL) if ri.type != LL else ri
            terms.append(f"{self.par(ri, P_MUL)} * {cv}.stride[{n}][{d}]")
        return R(f"{fn}({cv}.ptr[{n}], {' + '.join(terms)})", P_ATOM, vt)

    def _e_FlatLoad(self, e) -> R:
        name = self._array(e)
        n, fn, vt = self._load_fn(e, name)
        off = self._emit_as(e.args[1], LL)
        return R(f"{fn}({self.captured_var}.ptr[{n}], {off.text})", P_ATOM, vt)


# ---------------------------------------------------------------------------------------------------------
# Python / torch: a vectorised evaluator with Python semantics over int64 / float64 tensors


class _TorchOps:
    """Runtime helpers of generated torch evaluators: each accepts tensors and Python scalars."""

    inf, nan = math.inf, math.nan

    @staticmethod
    def f(x):
        return x.to(torch.float64) if isinstance(x, torch.Tensor) else float(x)

    @staticmethod
    def i(x):
        return x.to(torch.int64) if isinstance(x, torch.Tensor) else int(x)

    @staticmethod
    def b(x):
        return (x != 0) if isinstance(x, torch.Tensor) else bool(x)

    @staticmethod
    def _t(x):
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, bool):
            return torch.tensor(x)
        return torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else torch.int64)

    @staticmethod
    def min(a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return torch.minimum(_TorchOps._t(a), _TorchOps._t(b))
        return builtins.min(a, b)

    @staticmethod
    def max(a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return torch.maximum(_TorchOps._t(a), _TorchOps._t(b))
        return builtins.max(a, b)

    @staticmethod
    def where(c, a, b):
        if isinstance(c, torch.Tensor):
            return torch.where(c, _TorchOps._t(a), _TorchOps._t(b))
        return a if c else b

    @staticmethod
    def not_(x):
        return torch.logical_not(x) if isinstance(x, torch.Tensor) else (not x)

    @staticmethod
    def array(tensors, name):
        try:
            return tensors[name]
        except (KeyError, TypeError):
            raise BuildError(
                f"the expression reads array {name!r}; pass it as tensors={{{name!r}: tensor, ...}}"
            ) from None


def _torch_unary(tfn, mfn):
    return staticmethod(lambda x: tfn(x) if isinstance(x, torch.Tensor) else mfn(x))


for _n, _tf, _mf in (
    ("tanh", torch.tanh, math.tanh), ("exp", torch.exp, math.exp), ("exp2", torch.exp2, lambda x: 2.0**x),
    ("log", torch.log, math.log), ("log2", torch.log2, math.log2), ("log10", torch.log10, math.log10),
    ("sqrt", torch.sqrt, math.sqrt), ("rsqrt", torch.rsqrt, lambda x: 1.0 / math.sqrt(x)),
    ("sin", torch.sin, math.sin), ("cos", torch.cos, math.cos), ("tan", torch.tan, math.tan),
    ("asin", torch.asin, math.asin), ("acos", torch.acos, math.acos), ("atan", torch.atan, math.atan),
    ("sinh", torch.sinh, math.sinh), ("cosh", torch.cosh, math.cosh), ("erf", torch.erf, math.erf),
    # +-inf stays infinite (an unbounded block range), as torch.floor/ceil leave it
    ("floor", torch.floor, lambda x: x if math.isinf(x) else float(math.floor(x))),
    ("ceil", torch.ceil, lambda x: x if math.isinf(x) else float(math.ceil(x))),
    ("log1p", torch.log1p, math.log1p), ("expm1", torch.expm1, math.expm1),
    ("sign", torch.sign, lambda x: x if x != x else type(x)((x > 0) - (x < 0))),
):  # fmt: skip
    setattr(_TorchOps, _n, _torch_unary(_tf, _mf))
_TorchOps.atan2 = staticmethod(
    lambda a, b: torch.atan2(_TorchOps._t(a), _TorchOps._t(b)) if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else math.atan2(a, b)
)
_TorchOps.pow = staticmethod(lambda a, b: a**b)
_TorchOps.wrap = staticmethod(lambda i, n: torch.where(i < 0, i + n, i) if isinstance(i, torch.Tensor) else (i + n if i < 0 else i))


def _py_float(p, v):
    if math.isnan(v):
        return "_ag.nan", P_ATOM
    if math.isinf(v):
        return ("_ag.inf" if v > 0 else "(-_ag.inf)"), P_ATOM
    return (repr(v) if v >= 0 else f"({v!r})"), P_ATOM


def _py_cast(p, r, t):
    return f"_ag.{ {FLOAT: 'f', INT: 'i', LL: 'i', BOOL: 'b'}[t] }({r.text})", P_ATOM


# Python's own precedence differs from C's (& | bind tighter than comparisons), so every compound
# rendering is parenthesised: P_ATOM everywhere.
_TORCH_OPS = {
    **_C_OPS,
    "int": lambda p, v, t: (str(v) if v >= 0 else f"({v})", P_ATOM),
    "float": _py_float,
    "bool": lambda p, v: ("True" if v else "False", P_ATOM),
    "cast": _py_cast,
    "neg": lambda p, r: (f"(-{r.text})", P_ATOM),
    "add": lambda p, parts: ("(" + parts[0][1].text + "".join(f" {s} {r.text}" for s, r in parts[1:]) + ")", P_ATOM),
    "mul": lambda p, rs: ((rs[0].text if len(rs) == 1 else "(" + " * ".join(r.text for r in rs) + ")"), P_ATOM),
    "div": lambda p, a, b: (f"({a.text} / {b.text})", P_ATOM),
    "fdiv": lambda p, a, b: (f"({a.text} / {b.text})", P_ATOM),
    "floordiv": lambda p, a, b: (f"({a.text} // {b.text})", P_ATOM),
    "mod": lambda p, a, b: (f"({a.text} % {b.text})", P_ATOM),  # torch.remainder: Python's sign rule
    "fmod": lambda p, a, b: (f"({a.text} % {b.text})", P_ATOM),
    "shl1": lambda p, r: (f"(2 ** {r.text})", P_ATOM),
    "powi": lambda p, r, n, atomic: (f"({r.text} ** {n})", P_ATOM),
    "call": lambda p, name, *rs: (f"_ag.{name}({', '.join(r.text for r in rs)})", P_ATOM),
    "min": lambda p, a, b, t: (f"_ag.min({a.text}, {b.text})", P_ATOM),
    "max": lambda p, a, b, t: (f"_ag.max({a.text}, {b.text})", P_ATOM),
    "abs": lambda p, r, t: (f"abs({r.text})", P_ATOM),
    "sign": lambda p, r, t: (f"_ag.sign({r.text})", P_ATOM),
    "cmp": lambda p, op, a, b: (f"({a.text} {op} {b.text})", P_ATOM),
    "and": lambda p, rs: ("(" + " & ".join(r.text for r in rs) + ")", P_ATOM),
    "or": lambda p, rs: ("(" + " | ".join(r.text for r in rs) + ")", P_ATOM),
    "not": lambda p, r: (f"_ag.not_({r.text})", P_ATOM),
    "where": lambda p, c, a, b: (f"_ag.where({c.text}, {a.text}, {b.text})", P_ATOM),
    "wrap": lambda p, i, n: (f"_ag.wrap({i.text}, {n.text})", P_ATOM),
    "chk": lambda p, i, n, d, slot: (i.text, i.prec),  # the torch evaluator indexes with torch's own checks
}


class TorchPrinter(_Printer):
    """sympy -> Python source over torch tensors / Python numbers with Python semantics (int64, float64).

    Loads print as indexing of the array bound to the load's name (``t0[i, j]``); the value is an int
    for ILoad (or an integer dtype in ``captured``) and a float otherwise. See ``torch_function``.
    """

    TARGET = "torch"
    OPS = _TORCH_OPS

    def __init__(self, *, captured=None, summaries=None, symbol_names=None, local_types=None):
        super().__init__(captured=captured, summaries=summaries, symbol_names=symbol_names, local_types=local_types)
        self.arrays: Dict[str, str] = {}  # array name -> Python variable holding it

    def _e_Load(self, e) -> R:
        name = self._array(e)
        var = self.arrays.setdefault(name, f"_arr{len(self.arrays)}")
        idx = [self._emit_as(i, INT).text for i in e.args[1:]]
        if name in self.summaries:
            vt = INT if self.summaries[name][1] else FLOAT
        elif name in self.captured and self.captured[name][1] is not None:
            vt = _DTYPES[self.captured[name][1]][1]
        else:
            vt = INT if isinstance(e, ILoad) else FLOAT
        vt = INT if vt == LL else vt
        text = f"{var}[{', '.join(idx)}]"
        return R(*self.op("cast", R(text, P_ATOM, "?"), vt), vt)


def _py_name(sym, k: int) -> str:
    n = sym.name
    return n if n.isidentifier() and not keyword.iskeyword(n) and not n.startswith("_") else f"_a{k}"


def torch_function(expr, args: Sequence[Union[sympy.Symbol, str]], *, captured=None, summaries=None) -> Callable:
    """Compile ``expr`` into ``f(*values, tensors=None)``, a vectorised evaluator with Python semantics.

    ``args`` are the symbols (or their names) in call order; each value may be a Python int/float or a
    tensor (broadcast together; pass int64 for integers and float64 for floats to get Python's
    precision). Loads ``Load/ILoad(Symbol(name), idx...)`` index ``tensors[name]`` with the (broadcast)
    index tensors; the value converts to int64 (ILoad) or float64 (Load). Supports everything the CUDA
    printer does except ``FlatLoad``: + - * /, //, %, powers, floor/ceiling, Min/Max/Abs, comparisons,
    And/Or/Not/Xor, Piecewise and the float functions. The generated source is ``f.source``.
    """
    expr = sympy.sympify(expr)
    syms = []
    for a in args:
        if isinstance(a, str):
            match = [s for s in expr.free_symbols if s.name == a]
            a = match[0] if match else sympy.Symbol(a)
        syms.append(a)
    p = TorchPrinter(captured=captured, summaries=summaries)
    names = []
    for k, s in enumerate(syms):
        names.append(_py_name(s, k))
        p.symbol_names[s] = names[-1]
    load_names = {x.args[0] for x in expr.atoms(Load)}
    free = {s for s in expr.free_symbols if s not in load_names}
    missing = sorted(str(s) for s in free - set(syms))
    if missing:
        raise BuildError(f"torch_function: expression `{expr}` uses {missing}, which are not among args {list(map(str, syms))}; add them to args")
    body = p.doprint(expr)
    lines = [f"def _ag_eval({''.join(n + ', ' for n in names)}tensors=None):"]
    for name, var in p.arrays.items():
        lines.append(f"    {var} = _ag.array(tensors, {name!r})")
    lines.append(f"    return {body}")
    src = "\n".join(lines) + "\n"
    ns = {"_ag": _TorchOps}
    exec(compile(src, "<attngen.printer.torch_function>", "exec"), ns)  # noqa: S102 - our own generated code
    fn = ns["_ag_eval"]
    fn.source = src
    return fn
