"""Block-skip predicates in closed form.

From a traced mask M(b, h, q_idx, kv_idx) derive, as sympy expressions in the tile symbols
(I, J, BQ, BK, QLEN, KVLEN, QOFF, b, h and runtime per-block summaries):

* ``tile_any(I, J)``: an over-approximation of "some element of tile (I, J) is kept" (False => EMPTY);
* ``tile_all(I, J)``: an under-approximation of "every element is kept" (True => FULL),
  computed as ``not tile_any(not M)``, so one sound procedure serves both;
* kv-block ranges per q-block (and q-block ranges per kv-block): hulls of the kept set, and the
  sub-range of blocks that are kept for every row.

Soundness comes from interval bounds: every atom's expression is bounded over the tile from below and
above, and a conjunction/disjunction of over-approximations is an over-approximation. Exactness comes
from three refinements: (1) an atom monotone in an outer ``min``/``max``/``abs`` is rewritten on the
node's arguments (other piecewise terms are expanded into case splits); (2) atoms in one variable that
are monotone (``kv_idx < n``) cut the tile into sub-boxes on which they are constant; and (3) inside a
conjunction, atoms over one shared form (``q_idx - kv_idx``, ``q//C - kv//C``) are merged into one
interval (plus at most one congruence), decided exactly. Masks that read captured tensors get per-block
min/max summaries computed at run time in O(N).

Cost: expressions are built without sympy's evaluation (see "construction" below), and the refinements
that multiply work draw on a deterministic budget (WORK_BUDGET); past it, the structural bound, linear in
the formula, finishes the derivation and the predicates carry a note saying the map is coarse.
"""
from __future__ import annotations

import contextvars
import dataclasses
import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Dict, List, Optional, Sequence, Tuple

import sympy
from sympy.functions.elementary.piecewise import ExprCondPair
from sympy.logic.boolalg import And, Not, Or

from . import symbols as S
from .abi import MAX_SUMMARIES
from .trace import index_nonnegative
from .ir import BlockPredicates, CapturedTensor, Summary, TracedVariant

Rel = sympy.core.relational.Relational
true, false = sympy.true, sympy.false


# ----------------------------------------------------------------------------------------------
# work budget
# ----------------------------------------------------------------------------------------------

# Steps one derivation may take (a step: one tile_any call or one atom decided inside a conjunction). The
# exact refinements (box cuts, disjunctive normal form) multiply work; past the budget they stop and the
# rest of the derivation uses the linear structural bound: tiles classify partial instead of empty/full
# where only the refinements could tell, never the other way (docs/user-guide.md, "Block maps").
WORK_BUDGET = 12000


class _Work:
    def __init__(self, budget: int):
        self.left = budget
        self.exhausted = False

    def take(self, n: int = 1) -> bool:
        if self.left >= n:
            self.left -= n
            return True
        self.exhausted = True
        return False


_WORK: contextvars.ContextVar = contextvars.ContextVar("attngen_derive_work", default=None)


def _take(n: int = 1) -> bool:
    work = _WORK.get()
    return True if work is None else work.take(n)


# ----------------------------------------------------------------------------------------------
# normal forms
# ----------------------------------------------------------------------------------------------

def _atom(e, kind):
    """Normalised atom: kind in {'ge', 'gt', 'eq', 'ne'} meaning ``e >= 0``, ``e > 0``, ``e == 0``, ``e != 0``."""
    e = sympy.expand(e)
    if e.is_integer and kind == "gt":
        e, kind = e - 1, "ge"
    if e.is_number:
        v = {"ge": e >= 0, "gt": e > 0, "eq": sympy.Eq(e, 0), "ne": _ne(e, 0)}[kind]
        return true if bool(v) else false
    if kind == "ge":
        return sympy.Ge(e, 0, evaluate=False)
    if kind == "gt":
        return sympy.Gt(e, 0, evaluate=False)
    if e.could_extract_minus_sign():
        e = -e
    return (sympy.Eq if kind == "eq" else sympy.Ne)(e, 0, evaluate=False)


def _relation(rel, negate=False):
    """A sympy relation as a normalised atom (or its negation)."""
    a, b = rel.lhs, rel.rhs
    if isinstance(rel, sympy.Eq):
        return _atom(a - b, "ne" if negate else "eq")
    if isinstance(rel, sympy.Ne):
        return _atom(a - b, "eq" if negate else "ne")
    if isinstance(rel, (sympy.Ge, sympy.Gt)):
        e, strict = a - b, isinstance(rel, sympy.Gt)
    elif isinstance(rel, (sympy.Le, sympy.Lt)):
        e, strict = b - a, isinstance(rel, sympy.Lt)
    else:
        raise TypeError(rel)
    if negate:  # not(e >= 0) == -e > 0 ; not(e > 0) == -e >= 0
        return _atom(-e, "ge" if strict else "gt")
    return _atom(e, "gt" if strict else "ge")


def _first_piecewise_term(e):
    """The first Abs/Min/Max/Piecewise inside ``e`` (innermost first), or None."""
    for node in sympy.postorder_traversal(e):
        if isinstance(node, (sympy.Abs, sympy.Min, sympy.Max, sympy.Piecewise)) and not node.has(S.SCORE):
            return node
    return None


def _polarity(e, node) -> Optional[int]:
    """+1 when ``e`` is non-decreasing in ``node`` (every occurrence), -1 when non-increasing, None when
    neither is evident from its structure (sums, positive or negative constant multiples, floor, ceiling,
    min and max are monotone; anything else is not looked into)."""
    if e == node:
        return 1
    if not e.has(node):
        return 0
    if isinstance(e, (sympy.Add, sympy.Min, sympy.Max, sympy.floor, sympy.ceiling)):
        signs = {_polarity(a, node) for a in e.args} - {0}
        return signs.pop() if len(signs) == 1 and None not in signs else None
    if isinstance(e, sympy.Mul):
        coeff, rest = e.as_coeff_Mul()
        if coeff.is_number and coeff != 0 and not rest.is_Mul:
            p = _polarity(rest, node)
            return None if p is None else p * (1 if coeff > 0 else -1)
    return None


def _monotone_split(f):
    """Rewrite a relation whose expression is monotone in an outermost ``min``/``max``/``abs`` node into
    relations on the node's arguments, without case conditions: for ``e`` non-decreasing in the node,
    ``e(max(a, b)) >= 0  <=>  e(a) >= 0 | e(b) >= 0`` and ``e(min(a, b)) >= 0  <=>  e(a) >= 0 & e(b) >= 0``
    (strict alike; mirrored when non-increasing; ``abs(x) = max(x, -x)``; ``==`` is two ``>=``, ``!=`` two
    ``>``). The atom count grows with the number of such nodes, never with case conditions between them.
    None when no node qualifies."""
    if isinstance(f, (sympy.Eq, sympy.Ne)):
        e = f.lhs - f.rhs
        if _outer_monotone_node(e) is None:
            return None
        if isinstance(f, sympy.Eq):
            return _and(sympy.Ge(e, 0, evaluate=False), sympy.Ge(-e, 0, evaluate=False))
        return _or(sympy.Gt(e, 0, evaluate=False), sympy.Gt(-e, 0, evaluate=False))
    if isinstance(f, (sympy.Ge, sympy.Gt)):
        e, rel = f.lhs - f.rhs, type(f)
    elif isinstance(f, (sympy.Le, sympy.Lt)):
        e, rel = f.rhs - f.lhs, sympy.Ge if isinstance(f, sympy.Le) else sympy.Gt
    else:
        return None
    found = _outer_monotone_node(e)
    if found is None:
        return None
    node, pol = found
    args = (node.args[0], -node.args[0]) if isinstance(node, sympy.Abs) else node.args
    is_max = isinstance(node, (sympy.Max, sympy.Abs))
    parts = [rel(e.xreplace({node: a}), 0, evaluate=False) for a in args]
    return _or(*parts) if is_max == (pol > 0) else _and(*parts)


def _outer_monotone_node(e):
    """(node, polarity) for the outermost min/max/abs node of ``e`` in which ``e`` is monotone, or None."""
    for node in sympy.preorder_traversal(e):
        if isinstance(node, (sympy.Abs, sympy.Min, sympy.Max)) and not node.has(S.SCORE):
            pol = _polarity(e, node)
            if pol:
                return node, pol
    return None


def _cases(node) -> List[Tuple[sympy.Basic, sympy.Basic]]:
    """(condition, replacement) pairs covering every case of a piecewise-defined node."""
    if isinstance(node, sympy.Abs):
        x = node.args[0]
        return [(sympy.Ge(x, 0), x), (_lt(x, 0), -x)]
    if isinstance(node, (sympy.Min, sympy.Max)):
        args = list(node.args)
        out = []
        for k, a in enumerate(args):
            pick = sympy.Le if isinstance(node, sympy.Min) else sympy.Ge
            conds = [pick(a, o) for o in args if o is not a]
            out.append((_and(*conds), a))
        return out
    if isinstance(node, sympy.Piecewise):
        out, prior = [], false
        for val, cond in node.args:
            out.append((_and(cond, Not(prior)), val))
            prior = _or(prior, cond)
        return out
    raise TypeError(node)


def nnf(f, negate=False):
    """Negation normal form over normalised atoms, with Abs/Min/Max/Piecewise inside atoms
    expanded into case splits (exact: each case is a conjunction with the case condition)."""
    if f is true or f is false:
        return (false if f is true else true) if negate else f
    if isinstance(f, Not):
        return nnf(f.args[0], not negate)
    if isinstance(f, And):
        parts = [nnf(a, negate) for a in f.args]
        return _or(*parts) if negate else _and(*parts)
    if isinstance(f, Or):
        parts = [nnf(a, negate) for a in f.args]
        return _and(*parts) if negate else _or(*parts)
    if isinstance(f, (sympy.Xor, sympy.Equivalent, sympy.Implies, sympy.ITE)):
        return nnf(sympy.simplify_logic(f, form="dnf", deep=False) if len(f.atoms(Rel)) <= 6 else f.to_nnf(), negate)
    if isinstance(f, Rel):
        split = _monotone_split(f)
        if split is not None:
            return nnf(split, negate)
        node = _first_piecewise_term(f.lhs - f.rhs)
        if node is not None:
            # M(x) == OR_k (cond_k & M(x_k)); keeps exactness
            expanded = _or(*[_and(c, _replace(f, {node: v})) for c, v in _cases(node)])
            return nnf(expanded, negate)
        return _relation(f, negate)
    raise TypeError(f"cannot derive predicates for {f!r} ({type(f).__name__})")


# ----------------------------------------------------------------------------------------------
# boxes and bounds
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Box:
    """Integer box q in [qa, qb], kv in [ka, kb] (inclusive bounds, sympy expressions)."""

    qa: sympy.Expr
    qb: sympy.Expr
    ka: sympy.Expr
    kb: sympy.Expr

    def nonempty(self):
        return _and(_le(self.qa, self.qb), _le(self.ka, self.kb))

    def rng(self, var):
        return (self.qa, self.qb) if var == S.Q else (self.ka, self.kb)

    def with_range(self, var, lo, hi):
        if var == S.Q:
            return Box(lo, hi, self.ka, self.kb)
        return Box(self.qa, self.qb, lo, hi)


def tile_box() -> Box:
    return Box(
        S.I * S.BQ + S.QOFF,
        _min((S.I + 1) * S.BQ, S.QLEN) - 1 + S.QOFF,
        S.J * S.BK,
        _min((S.J + 1) * S.BK, S.KVLEN) - 1,
    )


class _Summaries:
    """Runtime per-block min/max arrays of captured tensors, created on demand while deriving."""

    def __init__(self, captured: Sequence[CapturedTensor], ranges: int = 2):
        # ranges: 2 = block ranges and full ranges from equal-value searches, 1 = block ranges only,
        # 0 = neither (fewer runtime arrays when a variant would need more than the ABI's slots)
        self.ranges = ranges
        self.by_name = {c.name: c for c in captured}
        self.list: List[Summary] = []
        self._index: Dict[str, sympy.Expr] = {}
        self.bounds_memo: Dict[tuple, tuple] = {}

    def load(self, load: sympy.Expr, var, which: str):
        """Bound of ``load`` (ILoad(t, [b,] var)) over the block of ``var``; None if not summarisable."""
        name = str(load.args[0])
        idx = load.args[1:]
        cap = self.by_name.get(name)
        if cap is None or idx[-1] != var or any(i.has(S.Q) or i.has(S.KV) for i in idx[:-1]):
            return None
        if any(i.free_symbols - {S.B, S.H} for i in idx[:-1]) or not all(index_nonnegative(i) for i in idx[:-1]):
            return None  # a possibly negative leading index wraps: no row of summaries stands for it
        axis = "q" if var == S.Q else "kv"
        sname = f"{name}_{axis}{which}"
        if sname not in self._index:
            s = Summary(
                name=f"s{len(self.list)}",
                axis=axis,
                spec=("reduce", name, axis, which, len(idx)),
                integer=bool(load.is_integer),
                key=f"{which}({name}) per {axis}-block",
            )
            self.list.append(s)
            self._index[sname] = s.name
        sym = self._index[sname]
        blk = S.I if axis == "q" else S.J
        nblocks = _ceil(S.QLEN / S.BQ) if axis == "q" else _ceil(S.KVLEN / S.BK)
        lead = sympy.Integer(0)
        if len(idx) == 2:  # (batch-or-head index, position): one row of summaries per leading index
            lead = idx[0]
        flat = lead * nblocks + blk
        return S.load(sym, flat, integer=bool(load.is_integer))


    def equal_range(self, g, hrest, var, full=False):
        """Hull along ``var`` of {var : t[var] == t[other] for some other in the block} when the atom
        is ``t[.., var] - t[.., other] == 0`` (or its negation) for one captured tensor. Block ranges come from prefix
        max / suffix min of per-block extremes (binary search, O(N/B log)): sound for any tensor,
        exact when the tensor is sorted (document ids). Returns element bounds or None."""
        other = S.Q if var == S.KV else S.KV
        if self.ranges < (2 if full else 1):
            return None
        if full and var == S.Q:
            # the backward's walk takes block ranges from these searches but no FULL run: a kv-block's FULL
            # range from runtime arrays would hold two registers of the sm90 consumers through the walk (they
            # spill), and its tiles are classified by tile_all anyway; the call computes two arrays fewer
            return None
        if isinstance(-g, S.ILoad) and isinstance(hrest, S.ILoad):  # t[other] - t[var] == 0: the same equation
            g, hrest = -g, -hrest
        if not (isinstance(g, S.ILoad) and isinstance(-hrest, S.ILoad)):
            return None
        lv, lo_ = g, -hrest
        if lv.args[0] != lo_.args[0] or lv.args[1:-1] != lo_.args[1:-1]:
            return None
        if lv.args[-1] != var or lo_.args[-1] != other or any(i.free_symbols - {S.B, S.H} for i in lv.args[1:-1]):
            return None
        if not all(index_nonnegative(i) for i in lv.args[1:-1]):
            return None  # a possibly negative leading index wraps: no row of summaries stands for it
        name = str(lv.args[0])
        if name not in self.by_name:
            return None
        axis = "q" if other == S.Q else "kv"  # the arrays are indexed by the other axis' block
        out = []
        for which in ("lo", "hi"):
            key = f"{name}_{var}{'full' if full else 'range'}{which}"
            if key not in self._index:
                what = "block fully equal to" if full else "block with equal"
                s = Summary(
                    name=f"s{len(self.list)}", axis=axis,
                    spec=("equal_range", name, var == S.KV, which, len(lv.args) - 1, full),
                    integer=True, key=f"{which} {what} {name} per {axis}-block, along {var}",
                )
                self.list.append(s)
                self._index[key] = s.name
            blk = S.I if axis == "q" else S.J
            nblocks = _ceil(S.QLEN / S.BQ) if axis == "q" else _ceil(S.KVLEN / S.BK)
            lead = lv.args[1] if len(lv.args) == 3 else 0
            out.append(S.load(self._index[key], lead * nblocks + blk, integer=True))
        vblk, base = (S.BK, 0) if var == S.KV else (S.BQ, S.QOFF)
        return out[0] * vblk + base, out[1] * vblk - 1 + base


@functools.lru_cache(maxsize=8192)
def _split_terms(e):
    """Split a sum into {var: [terms depending only on var]}, 'both': [...], const: expr (memoised: callers
    only read the lists)."""
    parts = {S.Q: [], S.KV: [], "both": []}
    const = sympy.Integer(0)
    for t in sympy.Add.make_args(sympy.expand(e)):
        hq, hk = t.has(S.Q), t.has(S.KV)
        if hq and hk:
            parts["both"].append(t)
        elif hq:
            parts[S.Q].append(t)
        elif hk:
            parts[S.KV].append(t)
        else:
            const += t
    return parts, const


INF = sympy.oo


# ----------------------------------------------------------------------------------------------
# construction without sympy's evaluation: min/max/floor/relations of symbolic bounds are built as they
# are (sympy compares every pair of min/max arguments through its assumption system on construction,
# which dominates derivation time); numbers still fold, infinities drop out
# ----------------------------------------------------------------------------------------------

_NONNEG = {S.B, S.H, S.I, S.J, S.QOFF, S.Q, S.KV}  # QOFF, q_idx and kv_idx are never negative at run time
_POSITIVE = {S.BQ, S.BK, S.QLEN, S.KVLEN}
_INF_F = float("inf")


def _num_range(e):
    """Numeric (low, high) of ``e`` over every run-time value of the tile symbols, from its structure alone
    (no assumption queries): what lets construction drop a min/max argument that can never be picked and
    fold a relation that always or never holds. (-inf, inf) when nothing is known."""
    hit = _RANGE_MEMO.get(e)
    if hit is not None:
        return hit
    r = _num_range_uncached(e)
    if len(_RANGE_MEMO) > 100_000:
        _RANGE_MEMO.clear()
    _RANGE_MEMO[e] = r
    return r


_RANGE_MEMO: Dict[sympy.Basic, Tuple] = {}


def _num_range_uncached(e):
    if e.is_Rational:
        v = Fraction(int(e.p), int(e.q))
        return v, v
    if e is INF:
        return _INF_F, _INF_F
    if e is -INF:
        return -_INF_F, -_INF_F
    if e in _NONNEG:
        return 0, _INF_F
    if e in _POSITIVE:
        return 1, _INF_F
    if e.is_Symbol and (e.is_positive or e.is_nonnegative):  # a runtime parameter: its assumption is its bound
        return (1 if e.is_integer and e.is_positive else 0), _INF_F
    if isinstance(e, sympy.Add):
        lo = hi = 0
        for a in e.args:
            alo, ahi = _num_range(a)
            lo, hi = lo + alo, hi + ahi
            if lo != lo or hi != hi:  # inf - inf
                return -_INF_F, _INF_F
        return lo, hi
    if isinstance(e, sympy.Mul):
        lo, hi = 1, 1
        for a in e.args:
            alo, ahi = _num_range(a)
            if lo >= 0 and alo >= 0:
                lo, hi = lo * alo, hi * ahi
            elif lo == hi and alo == ahi:
                lo = hi = lo * alo
            elif lo == hi and lo != 0 and abs(lo) != _INF_F:
                lo, hi = (lo * alo, lo * ahi) if lo > 0 else (lo * ahi, lo * alo)
            elif alo == ahi and alo != 0 and abs(alo) != _INF_F:
                lo, hi = (alo * lo, alo * hi) if alo > 0 else (alo * hi, alo * lo)
            else:
                return -_INF_F, _INF_F
            if lo != lo or hi != hi:
                return -_INF_F, _INF_F
        return lo, hi
    if isinstance(e, sympy.Pow) and e.exp == -1:
        blo, bhi = _num_range(e.base)
        if blo > 0:
            return (0 if bhi == _INF_F else 1 / Fraction(bhi)), 1 / Fraction(blo)
        return -_INF_F, _INF_F
    if isinstance(e, (sympy.Min, sympy.Max)):
        rs = [_num_range(a) for a in e.args]
        f = min if isinstance(e, sympy.Min) else max
        return f(r[0] for r in rs), f(r[1] for r in rs)
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        lo, hi = _num_range(e.args[0])
        rnd = math.floor if isinstance(e, sympy.floor) else math.ceil
        return (lo if abs(lo) == _INF_F else rnd(lo)), (hi if abs(hi) == _INF_F else rnd(hi))
    if isinstance(e, sympy.Mod) and e.args[1].is_Integer and e.args[1] > 0:
        return 0, int(e.args[1]) - 1
    if isinstance(e, sympy.Mod) and _positive_int(e.args[1]):
        return 0, _num_range(e.args[1])[1] - 1
    if isinstance(e, sympy.Piecewise):
        rs = [_num_range(v) for v, _ in e.args]
        return min(r[0] for r in rs), max(r[1] for r in rs)
    return -_INF_F, _INF_F


_RUNTIME_SYMBOLS = frozenset(S.TILE_SYMBOLS + S.ELEMENT_SYMBOLS)


def _positive_int(x) -> bool:
    """A divisor the floor / Mod rules may use besides a positive number: an integer expression in runtime
    parameters alone that is positive for every admissible value (chunked(size) with size a kernel argument)."""
    return bool(x.is_integer and x.is_positive and not (x.free_symbols & _RUNTIME_SYMBOLS))


def _positive_divisor(x) -> bool:
    """A divisor the floor / Mod bound rules take: a positive number, or a positive parameter expression."""
    return bool(x.is_number and x > 0) or _positive_int(x)


def _dominated(a, others, is_max):
    """Whether ``a`` can never be the max (is_max) / min of the argument list because another argument is
    always at least (at most) as large (small)."""
    alo, ahi = _num_range(a)
    for o in others:
        olo, ohi = _num_range(o)
        if (olo >= ahi) if is_max else (ohi <= alo):
            return True
    return False


def _lattice(cls, args):
    """And/Or of ``args`` as given: flattened, constants folded, duplicates dropped, no argument sorting or
    relational canonicalisation (sympy's constructor does both on every call, quadratic in formula size).
    Argument order follows construction order, which is deterministic."""
    zero, identity = (false, true) if cls is And else (true, false)
    out, seen = [], set()
    for a in args:
        a = true if a is True else false if a is False else a
        for x in (a.args if isinstance(a, cls) else (a,)):
            if x is zero:
                return zero
            if x is identity or x in seen:
                continue
            seen.add(x)
            out.append(x)
    if not out:
        return identity
    if len(out) == 1:
        return out[0]
    obj = sympy.Basic.__new__(cls, *out)
    obj._argset = frozenset(out)
    return obj


def _and(*args):
    return _lattice(And, args)


def _or(*args):
    return _lattice(Or, args)


def _minmax(cls, args, pick):
    flat = []
    for a in args:
        a = sympy.sympify(a)
        flat.extend(a.args if isinstance(a, cls) else (a,))
    absorbing, neutral = (INF, -INF) if cls is sympy.Max else (-INF, INF)
    if any(a == absorbing for a in flat):
        return absorbing
    nums = [a for a in flat if a.is_Number and a != neutral]
    # x + c1 and x + c2 (one symbolic part, constant offsets): only the extreme offset can be picked
    best: Dict[sympy.Basic, sympy.Basic] = {}
    for a in flat:
        if a.is_Number:
            continue
        c, x = a.as_coeff_Add()
        if x in best:
            c0 = best[x].as_coeff_Add()[0]
            if pick(c, c0) == c0:
                continue
        best[x] = a
    rest = list(best.values()) + ([pick(nums)] if nums else [])
    kept = []
    for k, a in enumerate(rest):
        if not _dominated(a, kept + rest[k + 1:], cls is sympy.Max):
            kept.append(a)
    rest = kept
    if not rest:
        return neutral
    if len(rest) == 1:
        return rest[0]
    obj = sympy.Basic.__new__(cls, *rest)  # as given: sympy would sort the arguments (a full traversal)
    obj._argset = frozenset(rest)
    return obj


def _max(*args):
    return _minmax(sympy.Max, args, max)


def _min(*args):
    return _minmax(sympy.Min, args, min)


def _floor(x):
    x = sympy.sympify(x)
    return sympy.floor(x) if x.is_Number else sympy.floor(x, evaluate=False)


def _mod(x, m):
    x = sympy.sympify(x)
    return sympy.Mod(x, m) if x.is_Number else sympy.Mod(x, m, evaluate=False)


def _ceil(x):
    x = sympy.sympify(x)
    return sympy.ceiling(x) if x.is_Number else sympy.ceiling(x, evaluate=False)


def _rel(cls):
    def build(a, b):
        a, b = sympy.sympify(a), sympy.sympify(b)
        if (a.is_Number or a in (INF, -INF)) and (b.is_Number or b in (INF, -INF)):
            return cls(a, b)
        if a == b:
            return cls(0, 0)
        alo, ahi = _num_range(a)
        blo, bhi = _num_range(b)
        if cls in (sympy.Le, sympy.Lt, sympy.Ge, sympy.Gt):
            lt_always, le_always = ahi < blo, ahi <= blo  # a < b / a <= b for every run-time value
            gt_always, ge_always = alo > bhi, alo >= bhi
            decided = {sympy.Le: (le_always, gt_always), sympy.Lt: (lt_always, ge_always),
                       sympy.Ge: (ge_always, lt_always), sympy.Gt: (gt_always, le_always)}[cls]
            if decided[0]:
                return true
            if decided[1]:
                return false
        return cls(a, b, evaluate=False)

    return build


_le, _lt, _ge, _gt, _ne = _rel(sympy.Le), _rel(sympy.Lt), _rel(sympy.Ge), _rel(sympy.Gt), _rel(sympy.Ne)



def _pw(*args):
    """Piecewise((value, condition), ...) built as is: sympy's constructor folds conditions that contain
    Piecewise (simplify_logic on every construction, exponential in nesting depth)."""
    pairs = []
    for value, cond in args:
        cond = true if cond is True else false if cond is False else cond
        if cond is false:
            continue
        pairs.append(sympy.Tuple.__new__(ExprCondPair, sympy.sympify(value), cond))
        if cond is true:
            break
    if len({p.args[0] for p in pairs}) == 1:  # one value whatever the conditions (the last one is true)
        return pairs[0].args[0]
    return sympy.Basic.__new__(sympy.Piecewise, *pairs)


def _mod_bounds(a, b, m):
    """Bounds of Mod(x, m) for integer x in [a, b]: within one period Mod is monotone, so
    [Mod(a), Mod(b)]; across a period boundary every residue may occur, [0, m-1]. Written with
    an indicator (1 when one period) instead of Piecewise, which sympy folds very slowly."""
    one_period = 1 - _min(1, _floor(b / m) - _floor(a / m))
    return _mod(a, m) * one_period, m - 1 - (m - 1 - _mod(b, m)) * one_period


def term_bounds(t, var, lo, hi, summ: Optional[_Summaries]):
    """Bounds (low, high) of a term that depends on ``var`` only, for var in [lo, hi]. Monotone
    pieces are exact; anything unrecognised gets (-oo, oo)."""
    coeff, rest = t.as_coeff_Mul()
    if coeff != 1:
        a, b = term_bounds(rest, var, lo, hi, summ)
        return (coeff * a, coeff * b) if coeff > 0 else (coeff * b, coeff * a)
    if t == var:
        return lo, hi
    poly = sympy.Poly(t, var) if t.is_polynomial(var) else None
    if poly is not None and poly.degree() == 1:
        a = poly.coeffs()[0]
        if a.is_number:
            c = t - a * var
            return (a * lo + c, a * hi + c) if a > 0 else (a * hi + c, a * lo + c)
    if isinstance(t, sympy.floor):
        inner = t.args[0]
        if inner.is_integer is not False:
            num, den = sympy.fraction(sympy.together(inner))
            if _positive_divisor(den):
                a, b = term_bounds(sympy.expand(num), var, lo, hi, summ)
                return _floor(a / den), _floor(b / den)
        a, b = term_bounds(inner, var, lo, hi, summ)
        return _floor(a), _floor(b)
    if isinstance(t, sympy.ceiling):
        a, b = term_bounds(t.args[0], var, lo, hi, summ)
        return _ceil(a), _ceil(b)
    if isinstance(t, sympy.Mod) and _positive_divisor(t.args[1]):
        m = t.args[1]
        a, b = term_bounds(t.args[0], var, lo, hi, summ)
        if a in (INF, -INF) or b in (INF, -INF):
            return sympy.Integer(0), m - 1 if m.is_integer else m
        return _mod_bounds(a, b, m)
    if isinstance(t, S.Load) and summ is not None and t.args[-1] == var:
        blo, bhi = summ.load(t, var, "min"), summ.load(t, var, "max")
        if blo is not None:
            return blo, bhi
    return -INF, INF


def expr_bounds(e, box: Box, summ: Optional[_Summaries]):
    """Bounds (low, high) of ``e`` over the box; memoised per derivation (the box cuts bound one form over
    the same box many times)."""
    memo = summ.bounds_memo if summ is not None else None
    if memo is not None:
        hit = memo.get((e, box))
        if hit is not None:
            return hit
    r = _expr_bounds(e, box, summ)
    if memo is not None:
        memo[(e, box)] = r
    return r


def _expr_bounds(e, box: Box, summ: Optional[_Summaries]):
    parts, const = _split_terms(e)
    lo, hi = const, const
    for var in (S.Q, S.KV):
        vlo, vhi = box.rng(var)
        for t in parts[var]:
            a, b = term_bounds(t, var, vlo, vhi, summ)
            lo, hi = lo + a, hi + b
    for t in parts["both"]:
        a, b = _both_bounds(t, box, summ)
        lo, hi = lo + a, hi + b
    return lo, hi


def _both_bounds(t, box, summ):
    coeff, rest = t.as_coeff_Mul()
    if coeff != 1:
        a, b = _both_bounds(rest, box, summ)
        return (coeff * a, coeff * b) if coeff > 0 else (coeff * b, coeff * a)
    if isinstance(t, sympy.floor):
        num, den = sympy.fraction(sympy.together(t.args[0]))
        if _positive_divisor(den):
            a, b = expr_bounds(sympy.expand(num), box, summ)
            return _floor(a / den), _floor(b / den)
    if isinstance(t, sympy.Mod) and _positive_divisor(t.args[1]):
        m = t.args[1]
        a, b = expr_bounds(t.args[0], box, summ)
        if a in (INF, -INF) or b in (INF, -INF):
            return sympy.Integer(0), m - 1
        return _mod_bounds(a, b, m)
    return -INF, INF


# ----------------------------------------------------------------------------------------------
# tile_any: sound over-approximation, exact for the affine / floor / mod / abs families
# ----------------------------------------------------------------------------------------------


def is_half_plane(mask, params: set) -> bool:
    """True when ``mask`` is one inequality between expressions linear in q_idx, kv_idx and the runtime parameters
    ``params`` (their symbols): a tile holds at most one edge of it, and its partial tiles cost one comparison per
    element."""
    if not isinstance(mask, (sympy.GreaterThan, sympy.StrictGreaterThan, sympy.LessThan, sympy.StrictLessThan)):
        return False
    diff = mask.lhs - mask.rhs
    gens = (S.Q, S.KV, *sorted(params, key=str))
    return diff.free_symbols <= set(gens) and diff.is_polynomial(*gens) and sympy.Poly(diff, *gens).total_degree() <= 1


def _vars(e):
    return {v for v in (S.Q, S.KV) if e.has(v)}


def _chunk_of(t, var):
    """(C, c) when ``t`` is floor((var + c) / C) with integers C > 0, c (C may be a runtime parameter); else None."""
    if not isinstance(t, sympy.floor):
        return None
    arg = sympy.expand(t.args[0])
    if not arg.is_polynomial(var) or arg.free_symbols - {var}:
        return None
    p = sympy.Poly(arg, var)
    if p.degree() != 1:
        return None
    a = p.coeffs()[0]
    b = sympy.expand(arg - a * var)
    if not (a.is_Rational and a > 0 and (1 / a).is_Integer or _positive_int(1 / a)):
        return None
    C = 1 / a
    c = sympy.expand(b * C)
    return (C, c) if c.is_Integer or (c.is_integer and not c.has(S.Q, S.KV)) else None


def _monotone_form(e):
    """Split ``e`` into (var, a, g, r): e == a*g + r with g = var or g = floor((var + c)/C) (both
    non-decreasing in var), a an integer, r free of q/kv. None when e is not of that shape."""
    vs = _vars(e)
    if len(vs) != 1:
        return None
    (var,) = vs
    parts, r = _split_terms(e)
    terms = parts[var]
    if len(terms) != 1 or r.has(S.Q) or r.has(S.KV) or not r.is_integer:
        return None
    a, g = terms[0].as_coeff_Mul()
    if not a.is_Integer or a == 0:
        return None
    if g == var or _chunk_of(g, var) is not None:
        return var, a, g, r
    return None


def _monotone_single(atom):
    """If ``atom`` is ``a*g(var) + r >= 0`` with g = var or floor((var + c)/C) and r free of q/kv,
    return (var, lo, hi): the bound on var (one of them None) describing where it holds."""
    if not isinstance(atom, sympy.Ge):
        return None
    mf = _monotone_form(atom.lhs)
    if mf is None:
        return None
    var, a, g, r = mf
    # a*g + r >= 0  <=>  g >= ceil(-r/a) (a > 0)  or  g <= floor(r/-a) (a < 0)
    glo = _ceil(-r / a) if a > 0 else None
    ghi = _floor(r / (-a)) if a < 0 else None
    if g == var:
        return var, glo, ghi
    C, c = _chunk_of(g, var)
    # floor((var + c)/C) >= m  <=>  var >= C*m - c ;  floor((var + c)/C) <= m  <=>  var <= C*m + C - 1 - c
    return var, (None if glo is None else C * glo - c), (None if ghi is None else C * ghi + C - 1 - c)


def _monotone_equalities_as_bounds(f):
    """One-variable monotone Eq/Ne atoms as conjunctions/disjunctions of >= atoms, so the box cuts
    below can decide them exactly (e == 0 <=> e >= 0 & -e >= 0; e != 0 <=> e - 1 >= 0 | -e - 1 >= 0)."""
    rep = {}
    for atom in f.atoms(sympy.Eq, sympy.Ne):
        e = atom.lhs
        if not e.is_integer or _monotone_form(e) is None:
            continue
        if isinstance(atom, sympy.Eq):
            rep[atom] = _and(_atom(e, "ge"), _atom(-e, "ge"))
        else:
            rep[atom] = _or(_atom(e - 1, "ge"), _atom(-e - 1, "ge"))
    return _replace(f, rep) if rep else f


def _q_chunk_term(f):
    """A floor((q + c)/C) term of ``f`` (in a two-variable atom), or None."""
    for atom in sorted(f.atoms(Rel), key=sympy.default_sort_key):
        e = atom.lhs
        if not (e.has(S.Q) and e.has(S.KV)):
            continue
        for t in sorted(e.atoms(sympy.floor), key=sympy.default_sort_key):
            if _chunk_of(t, S.Q) is not None:
                return t
    return None


def _replace(f, mapping):
    """``f`` with ``mapping`` applied: whole subformulas first, then inside atoms; the boolean structure is
    rebuilt with _and/_or and each changed atom without evaluation (a number folds to true/false)."""
    if f in mapping:
        return mapping[f]
    if isinstance(f, (And, Or)):
        return (_and if isinstance(f, And) else _or)(*[_replace(a, mapping) for a in f.args])
    if isinstance(f, Not):
        return Not(_replace(f.args[0], mapping))
    if isinstance(f, Rel):
        lhs, rhs = f.lhs.xreplace(mapping), f.rhs.xreplace(mapping)
        if lhs is f.lhs and rhs is f.rhs:
            return f
        d = lhs - rhs
        if d.is_Number:
            return true if bool(type(f)(d, 0)) else false
        return type(f)(lhs, rhs, evaluate=False)
    return f


def _substitute_atom(f, atom, value):
    return _replace(f, {atom: value})


@functools.lru_cache(maxsize=8192)
def _form_of(e):
    """Split an atom's expression into (form, offset) with form free of constants and of sign
    ambiguity: two atoms on one form constrain one integer quantity."""
    parts, const = _split_terms(e)
    form = sympy.expand(e - const)
    sign = 1
    if form.could_extract_minus_sign():
        form, sign = -form, -1
    return form, sign, const


_KIND = {sympy.Ge: "ge", sympy.Gt: "gt", sympy.Eq: "eq", sympy.Ne: "ne"}


def _conj_any(atoms: Sequence, box: Box, summ) -> sympy.Basic:
    """Over-approximate 'some point of the box satisfies all atoms'; exact within each form."""
    _take(len(atoms))
    groups: Dict[sympy.Expr, list] = {}
    for a in atoms:
        e = a.lhs
        # congruence atoms: Eq/Ne(Mod(x, m) - r, 0) become constraints on the form of x
        m_terms = [t for t in sympy.Add.make_args(e) if isinstance(t, sympy.Mod)]
        if isinstance(a, (sympy.Eq, sympy.Ne)) and len(m_terms) == 1 and (m_terms[0].args[1].is_Integer
                                                                          or _positive_int(m_terms[0].args[1])):
            mt = m_terms[0]
            r = sympy.expand(mt - e)  # the residue: Mod(x, m) ⋈ r
            if not r.has(S.Q) and not r.has(S.KV):
                form, sign, const = _form_of(mt.args[0])
                groups.setdefault(form, []).append(("mod" if isinstance(a, sympy.Eq) else "nmod", sign, const, mt.args[1], r))
                continue
        form, sign, const = _form_of(e)
        kind = _KIND[type(a)]
        groups.setdefault(form, []).append((kind, sign, const, None, None))
    out = []
    for form, cons in groups.items():
        out.append(_group_any(form, cons, box, summ))
    return _and(*out)


def _group_any(form, cons, box, summ):
    """Constraints on one integer quantity v = form(q, kv) (each as sign*v + const ⋈ 0)."""
    vlo, vhi = expr_bounds(form, box, summ)
    L, U = vlo, vhi
    strict_lo, strict_hi = [], []
    special = []
    for kind, sign, const, m, r in cons:
        if kind in ("ge", "gt"):
            # sign*v + const >= 0  ->  v >= -const (sign 1) or v <= const (sign -1)
            bound = -const if sign == 1 else const
            if kind == "gt" and not form.is_integer:
                (strict_lo if sign == 1 else strict_hi).append(bound)
                continue
            if kind == "gt":
                bound = bound + (1 if sign == 1 else -1)
            if sign == 1:
                L = _max(L, bound)
            else:
                U = _min(U, bound)
        elif kind == "eq":
            val = -const if sign == 1 else const
            L, U = _max(L, val), _min(U, val)
        else:
            special.append((kind, sign, const, m, r))
    conds = [_le(L, U)]
    conds += [_gt(U, s) for s in strict_lo] + [_lt(L, s) for s in strict_hi]
    if len(special) == 1:
        kind, sign, const, m, r = special[0]
        if kind == "ne":
            val = -const if sign == 1 else const
            conds.append(_or(_lt(L, U), _ne(L, val)))
        else:
            # Mod(sign*v + const, m) == r  <=>  v == s (mod m) for one residue s
            s = _mod(sign * (r - const), m)
            if kind == "mod":
                conds.append(_ge(_floor((U - s) / m) * m + s, L))
            else:
                # two consecutive values differ mod m unless m == 1 (a runtime dilation may be 1)
                conds.append(_or(_and(_lt(L, U), _gt(m, 1)), _ne(_mod(L, m), s)))
    elif special:
        # several congruences / disequalities on one form: each alone (sound, maybe loose)
        for kind, sign, const, m, r in special:
            conds.append(_group_any(form, [(kind, sign, const, m, r)], box, summ))
    return _and(*conds)


_MAX_SPLITS = 4
_MAX_DNF_TERMS = 64


def tile_any(f, box: Box, summ=None, splits: int = 0, chunk_cuts: int = 0):
    """Over-approximation of 'f holds somewhere in box' as a sympy boolean."""
    if f is true:
        return box.nonempty()
    if f is false:
        return false
    if not _take():
        return _structural_any(f, box, summ)
    f = _monotone_equalities_as_bounds(f)
    # (2) cut the box along a monotone one-variable atom
    if splits < _MAX_SPLITS:
        for atom in sorted(f.atoms(sympy.Ge), key=sympy.default_sort_key):
            ms = _monotone_single(atom)
            if ms is None:
                continue
            var, lo, hi = ms
            vlo, vhi = box.rng(var)
            if lo is not None:
                b_true = box.with_range(var, _max(vlo, lo), vhi)
                b_false = box.with_range(var, vlo, _min(vhi, lo - 1))
            else:
                b_true = box.with_range(var, vlo, _min(vhi, hi))
                b_false = box.with_range(var, _max(vlo, hi + 1), vhi)
            return _or(
                _and(b_true.nonempty(), tile_any(_substitute_atom(f, atom, true), b_true, summ, splits + 1, chunk_cuts)),
                _and(b_false.nonempty(), tile_any(_substitute_atom(f, atom, false), b_false, summ, splits + 1, chunk_cuts)),
            )
    # (2b) a q//C term shared with kv in one atom (q//C != kv//C next to |q - kv| <= w): cut the rows at
    # chunk boundaries so q//C is one constant on each piece; the atoms then become one-variable in kv and
    # the cuts above decide them. Two pieces make this exact whenever a block spans at most two chunks
    # (BQ <= C); wider pieces keep the (sound) per-form decision.
    term = _q_chunk_term(f) if chunk_cuts < 1 and _has_other_two_var_form(f) else None
    if term is not None:
        C, c = _chunk_of(term, S.Q)
        w = _floor((box.qa + c) / C)
        end1 = C * (w + 1) - c - 1  # last row of the first chunk
        b1 = box.with_range(S.Q, box.qa, _min(box.qb, end1))
        b2 = box.with_range(S.Q, end1 + 1, box.qb)
        one_chunk = _le(box.qb, end1 + C)
        sub = lambda k: tile_any(_replace(f, {term: w + k}), b1 if k == 0 else b2, summ, splits, chunk_cuts + 1)  # noqa: E731
        return _or(
            _and(b1.nonempty(), sub(0)),
            _and(b2.nonempty(), _or(_and(one_chunk, sub(1)),
                                  _and(Not(one_chunk), tile_any(f, b2, summ, splits, chunk_cuts + 1)))),
        )
    # (3) disjunctive normal form; each conjunction decided per form
    terms = _dnf_terms(f)
    if terms is None:
        return _structural_any(f, box, summ)
    return _and(box.nonempty(), _or(*[_conj_any(t, box, summ) for t in terms]))


def _has_other_two_var_form(f) -> bool:
    """Whether some two-variable atom of f has no floor term (a form that the floor forms interact with)."""
    return any(a.lhs.has(S.Q) and a.lhs.has(S.KV) and not a.lhs.has(sympy.floor) for a in f.atoms(Rel))


def _dnf_terms(f):
    """DNF as a list of atom lists, or None when it would blow up."""
    if isinstance(f, Or):
        out = []
        for a in f.args:
            t = _dnf_terms(a)
            if t is None:
                return None
            out += t
        return out if len(out) <= _MAX_DNF_TERMS else None
    if isinstance(f, And):
        acc = [[]]
        for a in f.args:
            t = _dnf_terms(a)
            if t is None:
                return None
            acc = [x + y for x in acc for y in t]
            if len(acc) > _MAX_DNF_TERMS:
                return None
        return acc
    return [[f]]


def _structural_any(f, box, summ):
    if isinstance(f, Or):
        return _or(*[_structural_any(a, box, summ) for a in f.args])
    if isinstance(f, And):
        return _and(*[_structural_any(a, box, summ) for a in f.args])
    return _and(box.nonempty(), _conj_any([f], box, summ))


# ----------------------------------------------------------------------------------------------
# ranges: hull of the kept set along one axis, and the sub-range kept for every row
# ----------------------------------------------------------------------------------------------

def _invert_monotone(g, var, glo, ghi):
    """Given g(var) in [glo, ghi] (either may be None = unbounded) with g monotone in var,
    return var bounds (lo, hi) (None = unbounded), or None when g is not understood."""
    coeff, rest = g.as_coeff_Mul()
    if coeff != 1 and coeff.is_number:
        if coeff > 0:
            return _invert_monotone(rest, var, None if glo is None else glo / coeff, None if ghi is None else ghi / coeff)
        return _invert_monotone(rest, var, None if ghi is None else ghi / coeff, None if glo is None else glo / coeff)
    if g == var:
        return (None if glo is None else _ceil(glo)), (None if ghi is None else _floor(ghi))
    if isinstance(g, sympy.Add):
        parts, const = _split_terms(g)
        if const != 0 and len(g.args) > 1:
            return _invert_monotone(g - const, var, None if glo is None else glo - const, None if ghi is None else ghi - const)
    if isinstance(g, sympy.floor):
        num, den = sympy.fraction(sympy.together(g.args[0]))
        if _positive_divisor(den):
            # floor(n/den) >= glo <=> n >= den*ceil(glo); floor(n/den) <= ghi <=> n <= den*floor(ghi) + den - 1
            return _invert_monotone(
                sympy.expand(num), var,
                None if glo is None else den * _ceil(glo),
                None if ghi is None else den * _floor(ghi) + den - 1,
            )
    return None


def _atom_hull(atom, var, other, obox: Box, summ):
    """Hull (lo, hi) of {var : exists other in its box range with atom} (None = unbounded), or
    'none' (no point) or None when not understood (caller treats as unbounded)."""
    e = atom.lhs
    if not e.has(var):
        return None  # no constraint on var (whether any row satisfies it is decided by tile_any)
    parts, const = _split_terms(e)
    if parts["both"]:
        return None
    g = sympy.Add(*parts[var])
    hrest = sympy.Add(*parts[other]) + const  # atom: g(var) + hrest ⋈ 0
    hlo, hhi = expr_bounds(hrest, obox, summ)
    if isinstance(atom, sympy.Ge):
        # g >= -hrest for some row: g >= min(-hrest) = -hhi
        return _invert_monotone(g, var, -hhi, None)
    if isinstance(atom, sympy.Gt):
        return _invert_monotone(g, var, -hhi, None)
    if isinstance(atom, sympy.Eq):
        r = summ.equal_range(g, hrest, var) if summ is not None else None
        return r if r is not None else _invert_monotone(g, var, -hhi, -hlo)
    return None


def _atom_kernel(atom, var, other, obox: Box, summ):
    """Interval (lo, hi) of var values for which the atom holds for EVERY other in its range;
    None when not understood (caller treats as empty)."""
    e = atom.lhs
    parts, const = _split_terms(e)
    if parts["both"] or not e.has(var):
        return None
    g = sympy.Add(*parts[var])
    hrest = sympy.Add(*parts[other]) + const
    hlo, hhi = expr_bounds(hrest, obox, summ)
    if isinstance(atom, sympy.Ge):
        return _invert_monotone(g, var, -hlo, None)
    if isinstance(atom, sympy.Gt):
        return _invert_monotone(g, var, -hlo + 1 if g.is_integer else -hlo, None)  # conservative
    if isinstance(atom, sympy.Eq):
        r = summ.equal_range(g, hrest, var, full=True) if summ is not None else None
        return r if r is not None else _invert_monotone(g, var, -hlo, -hhi)  # empty unless hrest is constant
    return None


def _kernel_union(parts):
    """An interval inside the union of intervals ``parts`` (each (lo, hi), possibly empty): two overlapping
    ones merge, otherwise the first non-empty one stands. Merged as a balanced tree, so each bound appears
    O(len(parts)**2.6) times in the result rather than exponentially many."""
    if len(parts) == 1:
        return parts[0]
    half = len(parts) // 2
    (lo, hi), (plo, phi) = _kernel_union(parts[:half]), _kernel_union(parts[half:])
    overlap = _and(_le(plo, hi + 1), _le(lo, phi + 1), _le(lo, hi), _le(plo, phi))
    return (_pw((_min(lo, plo), overlap), (lo, _le(lo, hi)), (plo, True)),
            _pw((_max(hi, phi), overlap), (hi, _le(lo, hi)), (phi, True)))


def hull(f, var, other, obox: Box, dom: Tuple, summ, kernel=False):
    """Interval hull of the kept set along ``var`` for rows ``other`` in the block (kernel=False),
    or an interval on which every row is kept (kernel=True). Returns (lo, hi) in dom."""
    dlo, dhi = dom
    empty = (dhi + 1, dlo - 1)
    if f is true:
        return dom
    if f is false:
        return empty
    if isinstance(f, And):
        los, his = [], []
        for a in f.args:
            lo, hi = hull(a, var, other, obox, dom, summ, kernel)
            los.append(lo)
            his.append(hi)
        return _max(*los), _min(*his)
    if isinstance(f, Or):
        parts = [hull(a, var, other, obox, dom, summ, kernel) for a in f.args]
        if not kernel:
            return _min(*[p[0] for p in parts]), _max(*[p[1] for p in parts])
        return _kernel_union(parts)
    # an atom
    if not f.has(var):
        # a condition on the rows only: all-or-nothing along var
        if kernel:
            holds = Not(tile_any(nnf(f, negate=True), obox, summ))
        else:
            holds = tile_any(f, obox, summ)
        return _pw((dlo, holds), (empty[0], True)), _pw((dhi, holds), (empty[1], True))
    r = (_atom_kernel if kernel else _atom_hull)(f, var, other, obox, summ)
    if r is None:
        return empty if kernel else dom
    lo, hi = r
    return (dlo if lo is None else _max(dlo, lo)), (dhi if hi is None else _min(dhi, hi))


# ----------------------------------------------------------------------------------------------
# captured-tensor equality (document ids): block ranges from sorted-prefix summaries
# ----------------------------------------------------------------------------------------------

def _block_range_from_hull(lo, hi, blk, n_blocks):
    """Blocks [floor(lo/blk), floor(hi/blk) + 1) covering elements [lo, hi]; empty when hi < lo."""
    # when hi < lo the range may keep one spurious block; tile_any then skips it
    return _floor(lo / blk), _floor(hi / blk) + 1


def _full_blocks(lo, hi, blk, length, n_blocks):
    """Blocks whose every element lies in [lo, hi] (the last block may be short)."""
    # hi never exceeds length-1; when it reaches it, the short last block counts too:
    # last = floor((hi + 1 + (blk - 1)*[hi == length-1]) / blk). Empty (hi < lo) gives last <= first.
    at_end = 1 - _min(1, length - 1 - hi)
    return _ceil(lo / blk), _floor((hi + 1 + (blk - 1) * at_end) / blk)


# ----------------------------------------------------------------------------------------------
# unions: one range per disjunct
# ----------------------------------------------------------------------------------------------

# Most ranges (parts) a mask's walk carries: each costs the kernels two registers and two compares per
# visited tile. A union of more disjuncts is cut into this many groups, each part the union of its group.
MAX_PARTS = 4
# Most disjuncts an And over Ors is distributed into; past it the And stays one disjunct.
_MAX_DISJUNCTS = 32
# Longest part bound (sympy operations) worth a walk over parts: the union masks people write (local + global,
# prefix-LM, window + sinks) have bounds of a few dozen.
_MAX_PART_OPS = 200


def _disjuncts(f) -> List:
    """f as a union of formulas (an Or's arguments, an And over Ors distributed), at most _MAX_DISJUNCTS; [f]
    when it is not a union."""
    if isinstance(f, Or):
        out = []
        for a in f.args:
            out += _disjuncts(a)
        return out if len(out) <= _MAX_DISJUNCTS else [f]
    if isinstance(f, And):
        combos = [[]]
        for a in f.args:
            combos = [c + [d] for c in combos for d in _disjuncts(a)]
            if len(combos) > _MAX_DISJUNCTS:
                return [f]
        return [_and(*c) for c in combos]
    return [f]


def _parts(f) -> List:
    """The parts the kernels walk: f's disjuncts, cut into at most MAX_PARTS groups (each the union of its
    group); [] when f is not a union."""
    ds = _disjuncts(f)
    if len(ds) < 2:
        return []
    n = min(len(ds), MAX_PARTS)
    return [_or(*ds[k * len(ds) // n:(k + 1) * len(ds) // n]) for k in range(n)]


def _part_hulls(parts, var, other, obox: Box, dom: Tuple, summ) -> Tuple:
    """Per part, the (lo, hi) hull of its kept set along ``var`` and its (full_lo, full_hi) kernel: an element
    outside every hull is masked, one inside any kernel kept. A part that groups several disjuncts takes its
    first disjunct's kernel: merging theirs grows fast with their number (thousands of operations for the
    NATTEN cases), and the kernel only spares tiles the classifier would call FULL anyway."""
    hulls = [hull(d, var, other, obox, dom, summ) for d in parts]
    if len(set(hulls)) < 2:
        return ()  # every part spans the same range (NATTEN's border cases): nothing to skip between them
    if any(sympy.count_ops(e) > _MAX_PART_OPS for h in hulls for e in h):
        return ()  # ranges this long cost more to print and evaluate per tile than the gaps they skip
    return tuple(h + hull(d.args[0] if isinstance(d, Or) else d, var, other, obox, dom, summ, kernel=True)
                 for h, d in zip(hulls, parts))


def derive(traced: TracedVariant) -> BlockPredicates:
    """Block predicates of a traced variant. Runtime range summaries are dropped (sound, less skipping)
    when a variant would need more per-block arrays than the kernel ABI has slots."""
    mask = traced.mask
    nqb = _ceil(S.QLEN / S.BQ)
    nkb = _ceil(S.KVLEN / S.BK)
    if mask is true:
        return BlockPredicates(
            kv_lo=sympy.Integer(0), kv_hi=nkb, kv_full_lo=sympy.Integer(0), kv_full_hi=nkb,
            q_lo=sympy.Integer(0), q_hi=nqb, q_full_lo=sympy.Integer(0), q_full_hi=nqb,
            tile_any=true, tile_all=true, needs_classifier=False, summaries=(),
        )
    for ranges in (2, 1, 0):
        work = _Work(WORK_BUDGET)
        token = _WORK.set(work)
        try:
            preds = _derive(traced, ranges)
        finally:
            _WORK.reset(token)
        if len(preds.summaries) <= MAX_SUMMARIES:
            break
    preds = dataclasses.replace(preds, analysis_steps=WORK_BUDGET - work.left)
    if work.exhausted:
        preds = dataclasses.replace(preds, notes=preds.notes + (
            f"coarse block map: the mask needed more than the analysis budget of {WORK_BUDGET} steps, so some "
            "tiles that are empty or full are classified partial (still correct, less skipping)",))
    return preds  # still too many summaries: codegen says so, block_map works regardless


def _derive(traced: TracedVariant, ranges: int) -> BlockPredicates:
    nqb = _ceil(S.QLEN / S.BQ)
    nkb = _ceil(S.KVLEN / S.BK)
    summ = _Summaries(traced.captured, ranges)
    pos = nnf(traced.mask)
    neg = nnf(traced.mask, negate=True)
    box = tile_box()
    any_ = tile_any(pos, box, summ)
    all_ = Not(tile_any(neg, box, summ))

    # kv range per q-block I: hull along KV over the q rows of block I
    qrows = Box(box.qa, box.qb, sympy.Integer(0), S.KVLEN - 1)
    kdom = (sympy.Integer(0), S.KVLEN - 1)
    parts = _parts(pos)
    klo, khi = hull(pos, S.KV, S.Q, qrows, kdom, summ)
    kv_lo, kv_hi = _block_range_from_hull(klo, khi, S.BK, nkb)
    kv_parts = tuple(_block_range_from_hull(lo, hi, S.BK, nkb) + _full_blocks(flo, fhi, S.BK, S.KVLEN, nkb)
                     for lo, hi, flo, fhi in _part_hulls(parts, S.KV, S.Q, qrows, kdom, summ))
    if kv_parts:
        # the walks take the widest of the parts' FULL runs (block_parts.cuh); the whole mask's kernel, a merge
        # of every part's, grows too fast with their number to be worth deriving: part 0's run stands in
        kv_full_lo, kv_full_hi = kv_parts[0][2:]
    else:
        kflo, kfhi = hull(pos, S.KV, S.Q, qrows, kdom, summ, kernel=True)
        kv_full_lo, kv_full_hi = _full_blocks(kflo, kfhi, S.BK, S.KVLEN, nkb)

    # q range per kv-block J (for the backward pass), positions relative to QOFF
    kcols = Box(S.QOFF, S.QLEN - 1 + S.QOFF, box.ka, box.kb)
    qdom = (S.QOFF, S.QLEN - 1 + S.QOFF)
    qlo, qhi = hull(pos, S.Q, S.KV, kcols, qdom, summ)
    q_lo, q_hi = _block_range_from_hull(qlo - S.QOFF, qhi - S.QOFF, S.BQ, nqb)
    q_parts = tuple(_block_range_from_hull(lo - S.QOFF, hi - S.QOFF, S.BQ, nqb)
                    + _full_blocks(flo - S.QOFF, fhi - S.QOFF, S.BQ, S.QLEN, nqb)
                    for lo, hi, flo, fhi in _part_hulls(parts, S.Q, S.KV, kcols, qdom, summ))
    if q_parts:
        q_full_lo, q_full_hi = q_parts[0][2:]
    else:
        qflo, qfhi = hull(pos, S.Q, S.KV, kcols, qdom, summ, kernel=True)
        q_full_lo, q_full_hi = _full_blocks(qflo - S.QOFF, qfhi - S.QOFF, S.BQ, S.QLEN, nqb)

    return BlockPredicates(
        kv_lo=kv_lo, kv_hi=kv_hi, kv_full_lo=kv_full_lo, kv_full_hi=kv_full_hi,
        q_lo=q_lo, q_hi=q_hi, q_full_lo=q_full_lo, q_full_hi=q_full_hi,
        tile_any=any_, tile_all=all_, needs_classifier=True, summaries=tuple(summ.list),
        kv_parts=kv_parts, q_parts=q_parts,
    )
