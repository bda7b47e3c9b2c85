"""Front end: call score_mod / mask_mod once with symbolic proxies and get sympy expressions.

A ``Sym`` proxy stands for a value inside a mod (the score, an index, or anything computed from them).
Python operators and the torch functions a mod may use (through ``__torch_function__``, which torch
consults for any argument type defining it, tensor indexing included) build sympy expressions.
Everything else raises ``UnsupportedOperation`` naming the operation, the user's source line, and
the supported spelling.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

import sympy
import torch

from . import symbols as S
from .errors import UnsupportedOperation
from .abi import MAX_PARAMS
from .ir import CapturedTensor, ParamSlot, TracedVariant
from .mods import MATH_SHIMS, Variant, as_variant
from .params import RuntimeParam, symbolic_reader

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
NEG_INF = -sympy.oo


# ----------------------------------------------------------------------------------------------
# error reporting
# ----------------------------------------------------------------------------------------------

def _user_frame() -> str:
    """The innermost stack frame outside attngen (and torch): the line of the user's mod."""
    f = sys._getframe(1)
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_PKG_DIR) and not fn.startswith(torch_dir) or os.sep + "variants" + os.sep in fn:
            import linecache

            line = linecache.getline(fn, f.f_lineno).strip()
            return f"{fn}:{f.f_lineno}: {line}" if line else f"{fn}:{f.f_lineno}"
        f = f.f_back
    return "<unknown source>"


def unsupported(what: str, fix: str) -> UnsupportedOperation:
    return UnsupportedOperation(f"{what} is not supported in a score_mod/mask_mod\n  at {_user_frame()}\n  fix: {fix}")


# ----------------------------------------------------------------------------------------------
# the proxy
# ----------------------------------------------------------------------------------------------

class _Tracer:
    """Per-trace state: captured tensors and runtime parameters in first-use order."""

    def __init__(self):
        self.captured: List[CapturedTensor] = []
        self._by_id: Dict[int, CapturedTensor] = {}
        self.params: List[ParamSlot] = []
        self._param_by_id: Dict[int, ParamSlot] = {}
        self.current_mod = ""  # "mask_mod 'name'" while that mod runs: CapturedTensor.source

    def capture(self, t: torch.Tensor) -> CapturedTensor:
        c = self._by_id.get(id(t))
        if c is None:
            c = CapturedTensor(name=f"t{len(self.captured)}", tensor=t, dtype=t.dtype, rank=t.dim(),
                               unit_stride_dims=tuple(d for d in range(t.dim()) if t.stride(d) == 1),
                               source=self.current_mod)
            self.captured.append(c)
            self._by_id[id(t)] = c
        return c


    def param(self, p: RuntimeParam) -> "Sym":
        """The proxy of runtime parameter ``p`` (params.py): one slot per parameter object."""
        slot = self._param_by_id.get(id(p))
        if slot is None:
            if len(self.params) >= MAX_PARAMS:
                raise unsupported(f"more than {MAX_PARAMS} runtime parameters (ATTNGEN_MAX_PARAMS)",
                                  "specialise some of them (specialize=True) or share one parameter object")
            slot = ParamSlot(len(self.params), p.name, p.integer, p.minimum, param=p)
            self.params.append(slot)
            self._param_by_id[id(p)] = slot
        return Sym(slot.symbol)


class _ActiveTracers(threading.local):
    """The traces running in this thread, innermost last: one per thread, so a trace never captures another
    thread's tensors or parameters."""

    def __init__(self):
        self.stack: List[_Tracer] = []


_ACTIVE = _ActiveTracers()


def _tracer() -> _Tracer:
    if not _ACTIVE.stack:
        raise RuntimeError("symbolic value used outside of attngen tracing")
    return _ACTIVE.stack[-1]


def _is_bool(e) -> bool:
    from sympy.logic.boolalg import BooleanAtom, BooleanFunction

    return isinstance(e, (BooleanFunction, BooleanAtom, sympy.core.relational.Relational))


def _is_int(e) -> bool:
    return not _is_bool(e) and bool(getattr(e, "is_integer", False))


def _const(x) -> sympy.Basic:
    """A Python constant as sympy. Integral floats become integers so ``score/30`` and ``score/30.0``
    are one variant; infinities become sympy's."""
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, float):
        if math.isinf(x):
            return sympy.oo if x > 0 else -sympy.oo
        if math.isnan(x):
            raise unsupported("a NaN constant", "use a finite value or -inf for masked entries")
        if x.is_integer():
            return sympy.Integer(int(x))
        return sympy.Float(x)
    raise TypeError(x)


def _lift(x, what: str = "operand") -> sympy.Basic:
    if isinstance(x, Sym):
        return x.expr
    if isinstance(x, (bool, int, float)):
        return _const(x)
    if isinstance(x, RuntimeParam):
        return _lift(x.operand(), what)
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            # a 0-d tensor is a runtime scalar: read at every call, never baked into the binary
            c = _tracer().capture(x)
            return S.load(c.name, integer=c.integer)
        raise unsupported(
            f"a whole tensor of shape {tuple(x.shape)} as an {what}",
            "index captured tensors with the index arguments, e.g. bias[h] or doc_ids[q_idx]",
        )
    raise unsupported(f"a value of type {type(x).__name__} as an {what}", "use Python numbers, the mod's arguments, or indexed tensors")


def _wrap(e) -> "Sym":
    return Sym(e)


def _num(e, op: str):
    if _is_bool(e):
        # bools in arithmetic act as 0/1, as in torch
        return sympy.Piecewise((sympy.Integer(1), e), (sympy.Integer(0), True))
    return e


def _boolean(e, op: str):
    if _is_bool(e):
        return e
    raise unsupported(
        f"`{op}` on a non-boolean value ({e})",
        "`&`, `|`, `~` combine comparisons (masks); compare first, e.g. (q_idx >= kv_idx) & (kv_idx < n)",
    )


def _floordiv(a, b):
    # floor of the true quotient is Python's // for ints and floats alike
    return sympy.floor(a / b)


def _mod(a, b):
    # sympy's Mod follows Python: the result takes the divisor's sign
    return sympy.Mod(a, b)


def _where(cond, x, y):
    c = _boolean(cond, "torch.where condition")
    if _is_bool(x) and _is_bool(y):
        return sympy.Or(sympy.And(c, x), sympy.And(sympy.Not(c), y))
    return sympy.Piecewise((_num(x, "where"), c), (_num(y, "where"), True))


def _minimum(a, b):
    return sympy.Min(_num(a, "min"), _num(b, "min"))


def _maximum(a, b):
    return sympy.Max(_num(a, "max"), _num(b, "max"))


def _clamp(x, lo=None, hi=None):
    e = _num(x, "clamp")
    if lo is not None:
        e = sympy.Max(e, lo)
    if hi is not None:
        e = sympy.Min(e, hi)
    return e


def _div(a, b, rounding_mode=None):
    if rounding_mode is None:
        return a / b
    if rounding_mode == "floor":
        return _floordiv(a, b)
    raise unsupported(f"division with rounding_mode={rounding_mode!r}", "use `//` (floor division) or rounding_mode='floor'")


def _log2(x):
    return sympy.log(x) / sympy.log(2)


def _sigmoid(x):
    return 1 / (1 + sympy.exp(-x))


def _log1p(x):
    from sympy.codegen.cfunctions import log1p

    return log1p(x)  # a node of its own, so it prints as log1pf (exact near 0), not logf(1 + x)


def _expm1(x):
    from sympy.codegen.cfunctions import expm1

    return expm1(x)


# torch function -> (sympy builder, arity). Methods (score.tanh()) map through _METHODS by name.
_UNARY = {
    "tanh": sympy.tanh,
    "exp": sympy.exp,
    "exp2": lambda x: sympy.Integer(2) ** x,
    "log": sympy.log,
    "log2": _log2,
    "sqrt": sympy.sqrt,
    "rsqrt": lambda x: 1 / sympy.sqrt(x),
    "sigmoid": _sigmoid,
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "atan": sympy.atan,
    "arctan": sympy.atan,
    "log1p": _log1p,
    "expm1": _expm1,
    "erf": sympy.erf,
    "sign": sympy.sign,
    "abs": sympy.Abs,
    "absolute": sympy.Abs,
    "neg": lambda x: -x,
    "negative": lambda x: -x,
    "square": lambda x: x * x,
    "floor": sympy.floor,
    "ceil": sympy.ceiling,
}
_BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "subtract": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "multiply": lambda a, b: a * b,
    "true_divide": lambda a, b: a / b,
    "floor_divide": _floordiv,
    "remainder": _mod,
    "pow": lambda a, b: a ** b,
    "minimum": _minimum,
    "maximum": _maximum,
    "fmin": _minimum,
    "fmax": _maximum,
    "eq": sympy.Eq,
    "ne": sympy.Ne,
    "lt": sympy.Lt,
    "le": sympy.Le,
    "gt": sympy.Gt,
    "ge": sympy.Ge,
    "logical_and": lambda a, b: sympy.And(_boolean(a, "logical_and"), _boolean(b, "logical_and")),
    "logical_or": lambda a, b: sympy.Or(_boolean(a, "logical_or"), _boolean(b, "logical_or")),
}
_SPECIAL = {
    "where": _where,
    "clamp": _clamp,
    "clip": _clamp,
    "div": _div,
    "divide": _div,
    "logical_not": lambda a: sympy.Not(_boolean(a, "logical_not")),
}
_FIXES = {
    "fmod": "use `%` (Python modulo) or torch.remainder",
    "bitwise_and": "use `&` on comparisons",
    "bitwise_or": "use `|` on comparisons",
    "softmax": "a mod sees one score at a time; attention applies the softmax",
}


def _lookup_torch_op(func) -> Tuple[str, Any]:
    name = getattr(func, "__name__", str(func))
    if name.endswith("_") and not name.startswith("__"):
        return name, None
    for table in (_SPECIAL, _UNARY, _BINARY):
        if name in table:
            return name, table[name]
    # min/max with a second tensor argument behave as minimum/maximum
    if name in ("min", "max"):
        return name, _minimum if name == "min" else _maximum
    return name, None


class Sym:
    """A symbolic value inside a mod."""

    _attngen_symbolic = True
    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr

    def __repr__(self):
        return f"Sym({self.expr})"

    # --- arithmetic ---------------------------------------------------------------------------
    def _bin(self, other, fn, op, reverse=False):
        a, b = _num(self.expr, op), _num(_lift(other), op)
        if reverse:
            a, b = b, a
        return _wrap(fn(a, b))

    __add__ = lambda s, o: s._bin(o, lambda a, b: a + b, "+")
    __radd__ = lambda s, o: s._bin(o, lambda a, b: a + b, "+", True)
    __sub__ = lambda s, o: s._bin(o, lambda a, b: a - b, "-")
    __rsub__ = lambda s, o: s._bin(o, lambda a, b: a - b, "-", True)
    __mul__ = lambda s, o: s._bin(o, lambda a, b: a * b, "*")
    __rmul__ = lambda s, o: s._bin(o, lambda a, b: a * b, "*", True)
    __truediv__ = lambda s, o: s._bin(o, lambda a, b: a / b, "/")
    __rtruediv__ = lambda s, o: s._bin(o, lambda a, b: a / b, "/", True)
    __floordiv__ = lambda s, o: s._bin(o, _floordiv, "//")
    __rfloordiv__ = lambda s, o: s._bin(o, _floordiv, "//", True)
    __mod__ = lambda s, o: s._bin(o, _mod, "%")
    __rmod__ = lambda s, o: s._bin(o, _mod, "%", True)
    __pow__ = lambda s, o: s._bin(o, lambda a, b: a ** b, "**")
    __rpow__ = lambda s, o: s._bin(o, lambda a, b: a ** b, "**", True)

    def __neg__(self):
        return _wrap(-_num(self.expr, "-"))

    def __pos__(self):
        return self

    def __abs__(self):
        return _wrap(sympy.Abs(_num(self.expr, "abs")))

    # --- comparisons ----------------------------------------------------------------------------
    def _cmp(self, other, rel):
        return _wrap(rel(_num(self.expr, "compare"), _num(_lift(other), "compare")))

    __lt__ = lambda s, o: s._cmp(o, sympy.Lt)
    __le__ = lambda s, o: s._cmp(o, sympy.Le)
    __gt__ = lambda s, o: s._cmp(o, sympy.Gt)
    __ge__ = lambda s, o: s._cmp(o, sympy.Ge)

    def __eq__(self, other):
        a, b = self.expr, _lift(other)
        if _is_bool(a) and _is_bool(b):
            return _wrap(sympy.Equivalent(a, b))
        return self._cmp(other, sympy.Eq)

    def __ne__(self, other):
        a, b = self.expr, _lift(other)
        if _is_bool(a) and _is_bool(b):
            return _wrap(sympy.Xor(a, b))
        return self._cmp(other, sympy.Ne)

    __hash__ = None

    # --- boolean algebra --------------------------------------------------------------------------
    def __and__(self, other):
        return _wrap(sympy.And(_boolean(self.expr, "&"), _boolean(_lift(other), "&")))

    __rand__ = __and__

    def __or__(self, other):
        return _wrap(sympy.Or(_boolean(self.expr, "|"), _boolean(_lift(other), "|")))

    __ror__ = __or__

    def __xor__(self, other):
        return _wrap(sympy.Xor(_boolean(self.expr, "^"), _boolean(_lift(other), "^")))

    __rxor__ = __xor__

    def __invert__(self):
        return _wrap(sympy.Not(_boolean(self.expr, "~")))

    # --- things a traced value cannot do ------------------------------------------------------------
    def __bool__(self):
        raise unsupported(
            "Python truth testing of a symbolic value (`if`, `and`, `or`, `not`, chained comparisons, "
            "builtin min/max)",
            "use torch.where(cond, a, b) instead of if/else, `&`/`|`/`~` instead of and/or/not, "
            "torch.minimum/torch.maximum instead of min/max",
        )

    def __index__(self):
        raise unsupported(
            "using a symbolic value as a Python integer (list/tuple indexing, range, slicing)",
            "index a torch tensor instead (captured tensors are read at run time): table[q_idx]",
        )

    def __int__(self):
        raise unsupported("int() of a symbolic value", "keep the value symbolic; use // for integer division")

    def __float__(self):
        raise unsupported(
            "float() of a symbolic value (also raised by math.* inside a helper function)",
            "use torch.tanh/torch.exp/... (or math.* directly in the mod's own body)",
        )

    def __len__(self):
        raise unsupported("len() of a symbolic value", "mods see one scalar element at a time")

    def __iter__(self):
        raise unsupported("iterating over a symbolic value", "mods see one scalar element at a time")

    def __setitem__(self, key, value):
        raise unsupported("item assignment", "mods must be pure: return a new value")

    def __getitem__(self, key):
        raise unsupported("indexing a score or index value", "index captured tensors, e.g. bias[h]")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name.endswith("_"):
            raise unsupported(
                f"the in-place method `.{name}()`", f"mods must be pure: write the out-of-place form (e.g. `.{name[:-1]}()` or an operator)"
            )
        fn = _UNARY.get(name) or _BINARY.get(name) or _SPECIAL.get(name)
        if fn is None and name in ("min", "max"):
            fn = _minimum if name == "min" else _maximum
        if fn is None:
            raise unsupported(f"the method `.{name}`", "see the supported operations in docs/user-guide.md")

        def method(*args, **kwargs):
            return _apply(name, fn, (self,) + args, kwargs)

        return method

    # --- torch functions ---------------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name == "__getitem__":
            return _index_captured(args[0], args[1])
        if name.startswith("__") and name.endswith("__"):
            # tensor operator with a proxy on the other side, e.g. slopes_0d * score
            base = name.strip("_")
            rev = base.startswith("r") and base[1:] in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or")
            op = base[1:] if rev else base
            a, b = args[0], args[1] if len(args) > 1 else None
            py = {"add": "__add__", "sub": "__sub__", "mul": "__mul__", "truediv": "__truediv__",
                  "floordiv": "__floordiv__", "mod": "__mod__", "pow": "__pow__", "and": "__and__",
                  "or": "__or__", "lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__",
                  "eq": "__eq__", "ne": "__ne__"}.get(op)
            if py is not None and b is not None:
                x, y = (b, a) if rev else (a, b)
                x = x if isinstance(x, Sym) else Sym(_lift(x))
                return getattr(x, py)(y)
            raise unsupported(f"the tensor operator {name}", "use plain Python operators on the mod's arguments")
        opname, fn = _lookup_torch_op(func)
        if fn is None:
            if opname.endswith("_"):
                raise unsupported(f"the in-place op torch.{opname}", "mods must be pure: use the out-of-place form")
            raise unsupported(f"torch.{opname}", _FIXES.get(opname, "see the supported operations in docs/user-guide.md"))
        return _apply(opname, fn, args, kwargs)


def _apply(name, fn, args, kwargs):
    if name in ("clamp", "clip"):
        x = args[0]
        lo = kwargs.get("min", args[1] if len(args) > 1 else None)
        hi = kwargs.get("max", args[2] if len(args) > 2 else None)
        return _wrap(_clamp(_lift(x), None if lo is None else _lift(lo), None if hi is None else _lift(hi)))
    if name in ("div", "divide"):
        return _wrap(_div(_num(_lift(args[0]), "/"), _num(_lift(args[1]), "/"), kwargs.get("rounding_mode")))
    if name in ("min", "max") and (len(args) != 2 or kwargs):
        raise unsupported(f"torch.{name} with a dim or one argument", f"use torch.{name}imum(a, b)")
    if kwargs.get("out") is not None:
        raise unsupported(f"torch.{name}(..., out=...)", "mods must be pure: drop out=")
    extra = set(kwargs) - {"out"}
    if extra:
        raise unsupported(f"torch.{name} with keyword arguments {sorted(extra)}", "pass plain positional arguments")
    lifted = [_lift(a) for a in args]
    if name not in ("where", "logical_and", "logical_or", "logical_not", "eq", "ne"):
        lifted = [_num(a, name) for a in lifted]
    return _wrap(fn(*lifted))


def _index_captured(t, index):
    if not isinstance(t, torch.Tensor):
        raise unsupported("indexing a non-tensor", "index captured torch tensors")
    idx = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis or i is None or isinstance(i, slice) for i in idx):
        raise unsupported("slicing / None / ... when indexing a captured tensor", "index every dimension with one scalar index, e.g. table[h, q_idx - kv_idx]")
    if len(idx) != t.dim():
        raise unsupported(
            f"indexing a captured tensor of rank {t.dim()} with {len(idx)} indices",
            f"index all {t.dim()} dimensions so the result is one element, e.g. t[{', '.join(['...'] * t.dim())}]",
        )
    exprs = []
    for i in idx:
        e = _lift(i, "index")
        if not _is_int(e):
            raise unsupported(f"a non-integer index ({e})", "indices must be integer expressions of b, h, q_idx, kv_idx")
        exprs.append(e)
    if t.dtype.is_complex:
        raise unsupported(f"a captured tensor of dtype {t.dtype}", "use a real floating-point or integer tensor")
    # a float tensor that requires grad is fine: the kernels only read it, attngen.autograd computes its gradient
    c = _tracer().capture(t)
    value = S.load(c.name, *exprs, integer=c.integer)
    if t.dtype == torch.bool:
        # an element of a bool tensor is a condition (key padding: valid[kv_idx]), read as 0/1
        return _wrap(sympy.Ne(value, 0))
    return _wrap(value)


# ----------------------------------------------------------------------------------------------
# canonical forms and mask hoisting
# ----------------------------------------------------------------------------------------------

def _normalize_relation(rel):
    """Integer relations as ``e >= 0``, ``Eq(e, 0)``, ``Ne(e, 0)`` with a canonical sign, so two
    spellings of one condition (q >= k, k <= q, q - k > -1) are the same expression."""
    lhs, rhs = rel.lhs, rel.rhs
    e = sympy.expand(lhs - rhs)
    if not (lhs.is_integer and rhs.is_integer):
        return rel
    if isinstance(rel, sympy.Ge):
        out = sympy.Ge(e, 0)
    elif isinstance(rel, sympy.Gt):
        out = sympy.Ge(e - 1, 0)
    elif isinstance(rel, sympy.Le):
        out = sympy.Ge(-e, 0)
    elif isinstance(rel, sympy.Lt):
        out = sympy.Ge(-e - 1, 0)
    elif isinstance(rel, (sympy.Eq, sympy.Ne)):
        if e.could_extract_minus_sign():
            e = -e
        out = type(rel)(e, 0)
    else:
        return rel
    return out


def canonicalize(expr):
    """Normalise relations bottom-up; keep everything else as sympy built it."""
    if isinstance(expr, sympy.core.relational.Relational):
        return _normalize_relation(expr.func(canonicalize(expr.lhs), canonicalize(expr.rhs)))
    if not getattr(expr, "args", None):
        return expr
    if isinstance(expr, S.Load):
        return expr
    if isinstance(expr, sympy.Piecewise):
        return sympy.Piecewise(*[(canonicalize(v), canonicalize(c)) for v, c in expr.args])
    return expr.func(*[canonicalize(a) for a in expr.args])


def _depends_on_score(e) -> bool:
    return S.SCORE in e.free_symbols


def hoist_mask(score):
    """Split ``score`` into (condition under which it is -inf regardless of the score, rest).

    Handles where/Piecewise branches that are -inf, and sums or positive multiples of them
    (``where(c, score, -inf) + bias``). Returns (sympy.false, score) when nothing hoists.
    """
    if score == NEG_INF:
        return sympy.true, sympy.Integer(0)
    if isinstance(score, sympy.Piecewise):
        neg = sympy.false
        seen_cond = sympy.false  # conditions of earlier branches
        kept = []
        for val, cond in score.args:
            this = sympy.And(cond, sympy.Not(seen_cond))
            if val == NEG_INF and not _depends_on_score(this):
                neg = sympy.Or(neg, this)
            else:
                sub_neg, sub_val = hoist_mask(val)
                if sub_neg is not sympy.false and not _depends_on_score(this):
                    neg = sympy.Or(neg, sympy.And(this, sub_neg))
                kept.append((sub_val, cond))
            seen_cond = sympy.Or(seen_cond, cond)
        if neg is sympy.false:
            return sympy.false, score
        if not kept:
            return sympy.true, sympy.Integer(0)
        # the last kept branch becomes the default: where the -inf branch applied, the mask decides
        kept[-1] = (kept[-1][0], sympy.true)
        rest = kept[0][0] if len(kept) == 1 else sympy.Piecewise(*kept)
        return neg, rest
    if isinstance(score, sympy.Add):
        neg, terms = sympy.false, []
        for t in score.args:
            n, v = hoist_mask(t)
            neg = sympy.Or(neg, n)
            terms.append(v)
        return (sympy.false, score) if neg is sympy.false else (neg, sympy.Add(*terms))
    if isinstance(score, sympy.Mul):
        coeff, rest = score.as_coeff_Mul()
        if coeff.is_positive and coeff != 1:
            n, v = hoist_mask(rest)
            if n is not sympy.false:
                return n, coeff * v
    return sympy.false, score


def simplify_mask(mask):
    mask = canonicalize(mask)
    if mask in (sympy.true, sympy.false):
        return mask
    atoms = mask.atoms(sympy.core.relational.Relational)
    if len(atoms) <= 5:  # simplify_logic is exponential in the atom count (truth-table minimisation)
        mask = sympy.simplify_logic(mask, form="dnf" if len(atoms) <= 4 else None, deep=False, force=True)
        mask = canonicalize(mask)
    return mask


# ----------------------------------------------------------------------------------------------
# captured-tensor indices that may be negative
# ----------------------------------------------------------------------------------------------

# b and h carry nonnegative=True; q_idx and kv_idx carry only integer=True (another assumption would change
# their srepr, hence every cache key), yet both are >= 0 at run time (q_offset is never negative), so signs
# are proved over these stand-ins.
_NONNEG_INDEX = {S.Q: sympy.Dummy("q_idx", integer=True, nonnegative=True),
                 S.KV: sympy.Dummy("kv_idx", integer=True, nonnegative=True)}


def index_nonnegative(index) -> bool:
    """True only when sympy proves the index >= 0 for all b, h, q_idx, kv_idx >= 0 (``q_idx``,
    ``h * 64 + kv_idx``, ``(q_idx - kv_idx) % 8``). False when it cannot (``q_idx - kv_idx``, ``h - 1``,
    a value loaded from another tensor): such an index gets torch's wrap of negative values."""
    return sympy.sympify(index).xreplace(_NONNEG_INDEX).is_nonnegative is True


def with_wrapped_dims(captured, *exprs) -> Tuple[CapturedTensor, ...]:
    """``captured`` with ``wrapped_dims`` recorded: (dim, size now) for every dim some load in ``exprs``
    indexes with an expression ``index_nonnegative`` cannot prove >= 0."""
    dims: Dict[str, set] = {}
    for e in exprs:
        for ld in sympy.sympify(e).atoms(S.Load):
            for d, i in enumerate(ld.args[1:]):
                if not index_nonnegative(i):
                    dims.setdefault(ld.args[0].name, set()).add(d)
    return tuple(
        dataclasses.replace(c, wrapped_dims=tuple((d, int(c.tensor.shape[d])) for d in sorted(dims[c.name])))
        if c.name in dims else c
        for c in captured
    )


_AXES = ((S.B, "b"), (S.H, "h"), (S.Q, "q"), (S.KV, "kv"))


def _extent_rule(index) -> Optional[Tuple[str, int]]:
    """(axis, c) when ``index`` is exactly one of b, h, q_idx, kv_idx plus an integer constant, else None."""
    index = sympy.expand(index)
    for sym, axis in _AXES:
        rest = index - sym
        if rest.is_Integer:
            return axis, int(rest)
    return None


def with_extent_rules(captured, *exprs) -> Tuple[CapturedTensor, ...]:
    """``captured`` with ``extent_rules`` recorded: (dim, axis, c) for every load index ``axis + c`` in
    ``exprs``, so each call can check the tensor covers the positions it reads (ir.check_extents)."""
    rules: Dict[str, set] = {}
    for e in exprs:
        for ld in sympy.sympify(e).atoms(S.Load):
            for d, i in enumerate(ld.args[1:]):
                rule = _extent_rule(i)
                if rule is not None:
                    rules.setdefault(ld.args[0].name, set()).add((d,) + rule)
    return tuple(dataclasses.replace(c, extent_rules=tuple(sorted(rules[c.name]))) if c.name in rules else c
                 for c in captured)


# ----------------------------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------------------------

def _call_traced(fn, args):
    out = fn(*args)
    if isinstance(out, Sym):
        return out.expr
    if isinstance(out, (bool, int, float)):
        return _const(out)
    if isinstance(out, RuntimeParam):
        return _lift(out)
    if isinstance(out, torch.Tensor) and out.dim() == 0:
        return _lift(out)
    raise unsupported(f"returning {type(out).__name__}", "return an expression of the mod's arguments")


def trace(variant) -> TracedVariant:
    """Trace a variant (anything ``as_variant`` accepts) into a TracedVariant."""
    variant = as_variant(variant)
    tracer = _Tracer()
    _ACTIVE.stack.append(tracer)
    try:
        with symbolic_reader(tracer.param):
            b, h, q, kv = Sym(S.B), Sym(S.H), Sym(S.Q), Sym(S.KV)
            mask = sympy.true
            if variant.mask_mod is not None:
                tracer.current_mod = f"mask_mod {variant.mask_mod.name!r}"
                mask = _call_traced(variant.mask_mod, (b, h, q, kv))
                if not _is_bool(mask):
                    raise UnsupportedOperation(
                        f"mask_mod {variant.mask_mod.name!r} returned a non-boolean expression ({mask}); "
                        "fix: return a comparison, e.g. q_idx >= kv_idx"
                    )
            score = S.SCORE
            if variant.score_mod is not None:
                tracer.current_mod = f"score_mod {variant.score_mod.name!r}"
                score = _call_traced(variant.score_mod, (Sym(S.SCORE), b, h, q, kv))
                if _is_bool(score):
                    raise UnsupportedOperation(
                        f"score_mod {variant.score_mod.name!r} returned a boolean ({score}); "
                        "fix: a score_mod returns a number; put conditions in a mask_mod or use torch.where"
                    )
    finally:
        _ACTIVE.stack.pop()
    score = canonicalize(score)
    neg, score = hoist_mask(score)
    if neg is not sympy.false:
        mask = sympy.And(mask, sympy.Not(neg))
    mask = simplify_mask(mask)
    captured = with_extent_rules(with_wrapped_dims(tracer.captured, score, mask), score, mask)
    return TracedVariant(variant=variant, score=score, mask=mask, captured=captured, params=tuple(tracer.params))
