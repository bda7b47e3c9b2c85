"""TracedVariant + BlockPredicates -> ``variant.inc``, the generated header of docs/kernel-interface.md.

Work is placed where it is cheapest. Every subexpression gets a level from the symbols it depends on:

    CONST  nothing            HEAD  b, h (and captured strides)
    ROW    b, h, q_idx        COL   b, h, kv_idx          ELEM  score, or q_idx and kv_idx together

The element functions (``score_mod``/``mask_mod``, called once per score) keep only ELEM work; every
maximal lower-level subtree becomes a field of ``HeadCtx`` / ``RowCtx`` / ``ColCtx``, computed once per
head / row / column by ``head_ctx`` / ``row_ctx`` / ``col_ctx``. Sums, products, ``&``/``|`` and
min/max are regrouped first (``score + q + kv + 1`` -> ``score + rc.r0 + cc.k0``), integer terms of
float arithmetic are converted to float in their context (alibi: ``slope*(kv - q)`` ->
``hc.h0 * (cc.k0 + rc.r0)`` with ``rc.r0 = (float)-q_idx``, ``cc.k0 = (float)kv_idx``: no int->float
conversion per element, and exact), and captured loads become flat 64-bit offsets so their
per-head/-row/-column parts hoist too. ``sympy.cse`` then removes repeated work inside each function.

Every ``floor(n/d)`` of integers is rewritten to ``FloorDiv`` before CSE (so CSE cannot split it into a
float ``1/d``), and the tile-level predicates print with ``i``/``j`` and the template's ``BQ``/``BK``.
A captured-tensor index that is not provably non-negative is wrapped as torch wraps it (``WrapIndex``:
``i < 0 ? i + size : i``, the size recorded at trace time in ``CapturedTensor.wrapped_dims``), so the
kernel reads the element the CPU path reads instead of memory before the tensor.
The backward kernels' derivatives (``gradients.py``: d score_mod / d score and one site per float captured load)
are lowered and hoisted the same way and printed as ``score_mod_grad`` / ``grad_site`` / ``grad_site_slot``.
The ``ag_*`` helpers the printed code calls live in ``templates/variant_math.cuh``, which the output includes.
The output is deterministic: the same input gives byte-identical text.
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Sequence, Tuple

import sympy

from .abi import MAX_PARAMS
from .errors import BuildError
from .gradients import derive_gradients
from .ir import MAX_CAPTURED, MAX_SUMMARIES, BlockPredicates, TracedVariant
from .printer import (
    BOOL,
    C_TYPES,
    FLOAT,
    CheckIndex,
    INT,
    LL,
    CudaPrinter,
    FlatILoad,
    FlatLoad,
    ToFloat,
    WrapIndex,
    lower_int_division,
)
from .symbols import BK, BQ, H, I, ILoad, J, KV, KVLEN, Load, Q, QLEN, QOFF, SCORE, B
from .trace import index_nonnegative

__all__ = ["render_variant_inc"]

CONST, HEAD, ROW, COL, ELEM = range(5)
_PREFIX = {HEAD: "hc.h", ROW: "rc.r", COL: "cc.k"}

# Block bounds are ints in C; an unbounded side (+-oo) prints as +-2**30, far outside any block count
# and safe to add small constants to.
_BIG = 2**30


_FLIP = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "==": "==", "!=": "!="}


def _join(a: int, b: int) -> int:
    if a == b:
        return a
    if {a, b} == {ROW, COL}:
        return ELEM
    return max(a, b)


def _below(low: int, high: int) -> bool:
    return low != high and _join(low, high) == high


def _assumptions(e) -> dict:
    if isinstance(e, sympy.logic.boolalg.Boolean) and not isinstance(e, sympy.Expr):
        return {}
    if e.is_integer:
        return {"integer": True}
    if e.is_real:
        return {"real": True}
    return {}


class _Hoister:
    """Moves maximal HEAD/ROW/COL subtrees of element-level expressions into context-struct fields."""

    _GROUPABLE = (sympy.Add, sympy.Mul, sympy.And, sympy.Or, sympy.Min, sympy.Max)

    def __init__(self, levels: Dict[sympy.Symbol, int]):
        self.levels = dict(levels)
        self.defs: Dict[int, List[Tuple[sympy.Symbol, sympy.Basic]]] = {HEAD: [], ROW: [], COL: []}
        self._memo: Dict[Tuple[int, sympy.Basic], sympy.Symbol] = {}
        self._lv: Dict[sympy.Basic, int] = {}

    def level(self, e) -> int:
        lv = self._lv.get(e)
        if lv is None:
            if isinstance(e, sympy.Symbol):
                lv = self.levels.get(e, CONST)  # array names of loads are CONST
            elif isinstance(e, FlatLoad):
                lv = self.level(e.args[1])
            elif isinstance(e, Load):
                lv = CONST
                for a in e.args[1:]:
                    lv = _join(lv, self.level(a))
            else:
                lv = CONST
                for a in e.args:
                    lv = _join(lv, self.level(a))
            self._lv[e] = lv
        return lv

    @staticmethod
    def _trivial(e) -> bool:
        if e.is_Atom:
            return True
        if isinstance(e, sympy.Tuple):  # ExprCondPair & co. are not values
            return True
        return e.is_Mul and len(e.args) == 2 and e.args[0] == -1 and e.args[1].is_Atom

    def top(self, e):
        return self.sub(e, ELEM)

    def sub(self, e, T: int):
        L = self.level(e)
        if L != CONST and _below(L, T) and not self._trivial(e):
            return self.var(e, L)
        return self.lower(e, T)

    def var(self, e, L: int) -> sympy.Symbol:
        e = self.lower(e, L)
        key = (L, e)
        sym = self._memo.get(key)
        if sym is None:
            sym = sympy.Symbol(f"{_PREFIX[L]}{len(self.defs[L])}", **_assumptions(e))
            self.defs[L].append((sym, e))
            self.levels[sym] = L
            self._memo[key] = sym
        return sym

    def _distribute(self, e):
        """head * (row + col) at element level, with integer row/col terms:
        * in an integer product, distribute: h*(kv - q) -> h*kv - h*q (exact), each product hoists;
        * in a float product (alibi's slope*(kv - q)), convert the row and column sums to float in their
          contexts and keep one float add and one multiply per element: slope*(cc.k0 + rc.r0). Exact
          while indices stay below 2**24, unlike slope*kv - slope*q, which loses the small difference.
        """
        if not e.is_Mul:
            return e
        inner = [f for f in e.args if self.level(f) == ELEM]
        if len(inner) != 1 or not inner[0].is_Add or not inner[0].is_integer:
            return e
        add = inner[0]
        if any(self.level(f) not in (CONST, HEAD) for f in e.args if f is not add):
            return e
        if any(self.level(t) == ELEM for t in add.args):
            return e
        if e.is_integer:
            return sympy.expand_mul(e, deep=False)
        row = [t for t in add.args if self.level(t) != COL]
        col = [t for t in add.args if self.level(t) == COL]
        new_add = sympy.Add(ToFloat(sympy.Add(*row)), ToFloat(sympy.Add(*col)))
        return sympy.Mul(*[f for f in e.args if f is not add], new_add)

    def _row_col_square(self, f):
        """(row + col)**2 of integers inside a float expression -> (float(row) + float(col))**2: the int->float
        conversions move to the row / column contexts. Same value while |q_idx|, |kv_idx| < 2**24: the float sum
        is exact and the product rounds once, as the conversion of the exact int square does (which, unlike
        the float square, overflows int32 past a difference of 46340)."""
        if not (f.is_Pow and f.exp == 2 and f.base.is_Add and f.base.is_integer and self.level(f) == ELEM):
            return f
        if any(self.level(t) == ELEM for t in f.base.args):
            return f
        col = [t for t in f.base.args if self.level(t) == COL]
        row = [t for t in f.base.args if self.level(t) != COL]
        return sympy.Pow(sympy.Add(ToFloat(sympy.Add(*row)), ToFloat(sympy.Add(*col))), 2)

    def _split_relation(self, e):
        """An element-level integer relation rewritten so that its row and column parts are hoisted apart:
        * ``E + C + R op 0`` -> ``E + C op -R`` (C: per-column terms, R: per-row / per-head / constant terms):
          ``kv - q + 512 >= 0`` -> ``kv_idx >= rc.r0`` with ``rc.r0 = q_idx - 512``, one compare per element;
        * ``K - |X| >= 0`` (K not per-element) -> ``K - X >= 0 & K + X >= 0``, each then split as above;
        * ``(C + R) % m == r`` (m > 0, 0 <= r < m constants) -> ``C % m == (r - R) % m`` (Python's % is in [0, m):
          congruence of the parts), e.g. ``(q - kv) % 2 == 0`` -> ``cc.k0 == rc.r0``.
        Exact integer rewrites. Returns None when nothing applies."""
        if not isinstance(e, sympy.core.relational.Relational) or e.rel_op not in _FLIP:
            return None
        d = e.lhs - e.rhs
        if not d.is_integer:
            return None  # moving float terms across would change rounding
        op = e.rel_op
        terms = list(d.args) if d.is_Add else [d]
        if op in (">=", ">"):
            neg_abs = [t for t in terms if t.is_Mul and len(t.args) == 2 and t.args[0] == -1
                       and isinstance(t.args[1], sympy.Abs)]
            if len(neg_abs) == 1:
                X = neg_abs[0].args[1].args[0]
                K = d + neg_abs[0].args[1]
                if X.is_integer and self.level(K) != ELEM:
                    rel = sympy.Ge if op == ">=" else sympy.Gt
                    return sympy.And(rel(K - X, 0), rel(K + X, 0))
        if op in ("==", "!="):
            mods = [t for t in terms if isinstance(t, sympy.Mod)]
            rest = d - mods[0] if len(mods) == 1 else None
            if rest is not None and rest.is_Integer and mods[0].args[1].is_Integer and mods[0].args[1] > 0:
                X, m = mods[0].args
                r = -rest
                xs = list(X.args) if X.is_Add else [X]
                col = [t for t in xs if self.level(t) == COL]
                other = [t for t in xs if self.level(t) not in (COL, ELEM)]
                if 0 <= r < m and col and other and len(col) + len(other) == len(xs):
                    C, R = sympy.Add(*col), sympy.Add(*other)
                    if C.could_extract_minus_sign():
                        C, R, r = -C, -R, -r
                    return e.func(sympy.Mod(C, m), sympy.Mod(r - R, m))
        lhs = [t for t in terms if self.level(t) in (ELEM, COL)]
        rhs = [-t for t in terms if self.level(t) not in (ELEM, COL)]
        if not lhs or not rhs or not any(self.level(t) != CONST for t in rhs) and len(rhs) == 1 and len(lhs) == 1:
            return None
        L, Rr = sympy.Add(*lhs), sympy.Add(*rhs)
        if L.could_extract_minus_sign():
            L, Rr, op = -L, -Rr, _FLIP[op]
        new = sympy.core.relational.Relational(L, Rr, op)
        return None if new == e else new

    def lower(self, e, T: int):
        if e.is_Atom or not e.args:
            return e
        if T == ELEM and e.is_Mul:
            d = self._distribute(e)
            if d is not e and d != e:
                return self.lower(d, T)
        if T == ELEM and (e.is_Mul or e.is_Add) and not e.is_integer:
            args = [self._row_col_square(a) for a in e.args]
            if args != list(e.args):
                e = e.func(*args)
        if T == ELEM and isinstance(e, sympy.core.relational.Relational):
            r = self._split_relation(e)
            if isinstance(r, sympy.core.relational.Relational):
                return r.func(*[self.sub(a, T) for a in r.args])
            if r is not None:
                return self.lower(r, T)
        if isinstance(e, self._GROUPABLE):
            return self._group(e, T)
        return e.func(*[self.sub(a, T) for a in e.args])

    def _group(self, e, T: int):
        cls = e.func
        args = list(e.args)
        if cls is sympy.Add and T == ELEM:
            flat = []
            for a in args:
                d = self._distribute(a)
                flat.extend(d.args if d.is_Add else [d])
            args = flat
        keep, consts = [], []
        buckets = {HEAD: [], ROW: [], COL: []}
        for a in args:
            L = self.level(a)
            if L == CONST:
                consts.append(a)
            elif L == T:
                keep.append(self.lower(a, T))
            else:
                buckets[L].append(a)
        if T == ELEM and buckets[HEAD] and (buckets[ROW] or buckets[COL]):
            buckets[ROW if buckets[ROW] else COL] += buckets.pop(HEAD)
            buckets[HEAD] = []
        if consts:  # constants join a hoisted group: q + kv + 1 -> (q + 1) + kv, c*h*score -> (c*h)*score
            home = next((L for L in (ROW, COL, HEAD) if buckets[L]), None)
            if home is not None:
                buckets[home] += consts
                consts = []
        keep += consts
        # integer terms of a float sum/product are converted to float once, in their context
        to_float = cls in (sympy.Add, sympy.Mul, sympy.Min, sympy.Max) and not e.is_integer
        for L in (HEAD, ROW, COL):
            if buckets[L]:
                g = cls(*buckets[L])
                if to_float and g.is_integer:
                    keep.append(self.var(ToFloat(g), L))
                else:
                    keep.append(self.lower(g, L) if self._trivial(g) else self.var(g, L))
        return cls(*keep)


def _comment(text: str) -> str:
    """One safe line for a // comment (no trailing backslash continuation, no newlines)."""
    return re.sub(r"\s+", " ", str(text)).replace("\\", "/")


def _check_symbols(what: str, expr, allowed: Iterable[sympy.Symbol], arrays: Iterable[str]) -> None:
    arrays = set(arrays)
    names = {x.args[0] for x in expr.atoms(Load)} | {x.args[0] for x in expr.atoms(FlatLoad)}
    for n in names:
        if not isinstance(n, sympy.Symbol) or n.name not in arrays:
            raise BuildError(
                f"{what} `{expr}` reads array {n}, which is not among the captured tensors / summaries "
                f"({', '.join(sorted(arrays)) or 'none'}); list it in TracedVariant.captured or BlockPredicates.summaries"
            )
    extra = expr.free_symbols - set(allowed) - names
    if extra:
        raise BuildError(
            f"{what} `{expr}` uses {sorted(map(str, extra))}, but only {sorted(map(str, allowed))} exist at this "
            "level; element mods see score, b, h, q_idx, kv_idx and block predicates see i/j, BQ, BK, QLEN, "
            "KVLEN, QOFF, b, h"
        )


def _param_reads(traced: TracedVariant) -> Dict[sympy.Symbol, sympy.Symbol]:
    """{parameter symbol: its read from CapturedArgs} (``c.iparam[slot]`` int32, ``c.fparam[slot]`` float32)."""
    if len(traced.params) > MAX_PARAMS:
        raise BuildError(f"a variant may read at most {MAX_PARAMS} runtime parameters (ATTNGEN_MAX_PARAMS), got "
                         f"{len(traced.params)}; specialise some (specialize=True)")
    return {p.symbol: sympy.Symbol(f"c.{'i' if p.integer else 'f'}param[{p.slot}]", **p.symbol.assumptions0)
            for p in traced.params}


def _stride_symbols(traced: TracedVariant):
    """Stride symbols per captured tensor: Symbol('c.stride[n][d]'), printed verbatim, typed long long; the
    literal 1 for the dims traced with unit stride (CapturedTensor.unit_stride_dims)."""
    out = {}
    for n, ct in enumerate(traced.captured):
        if not 1 <= ct.rank <= 4:
            raise BuildError(
                f"captured tensor {ct.name} has rank {ct.rank}; generated kernels read tensors of rank 1 to 4 "
                "(CapturedArgs.stride has 4 entries); reshape it"
            )
        out[ct.name] = [sympy.Integer(1) if d in ct.unit_stride_dims else sympy.Symbol(f"c.stride[{n}][{d}]", integer=True)
                        for d in range(ct.rank)]
    return out


def _wrap_indices(expr, captured):
    """Wrap every captured-tensor index not provably >= 0 in ``WrapIndex(i, size)`` (torch semantics of
    a negative index), the size taken from ``CapturedTensor.wrapped_dims``. Provably non-negative indices
    (``doc[q_idx]``, ``slopes[h]``) are left as they are, so their code does not change."""
    sizes = {c.name: (c, dict(c.wrapped_dims)) for c in captured}

    def rep(e):
        name = e.args[0].name
        if name not in sizes:
            return e  # summary arrays: indexed by block numbers, never negative
        ct, dims = sizes[name]
        idx = list(e.args[1:])
        for d, i in enumerate(idx):
            if index_nonnegative(i):
                continue
            if d not in dims:
                raise BuildError(
                    f"load `{e}` indexes dim {d} of captured tensor {name} with `{i}`, which may be negative; "
                    f"generated code wraps such an index as torch does (index -1 is the last element) and needs "
                    f"the dim's size, but CapturedTensor.wrapped_dims of {name} is {ct.wrapped_dims!r}. Build the "
                    "variant with attngen.trace.trace (it records them), or pass wrapped_dims=((dim, size), ...)"
                )
            idx[d] = WrapIndex(i, sympy.Integer(dims[d]))
        return e.func(e.args[0], *idx)

    return sympy.sympify(expr).replace(lambda e: isinstance(e, Load), rep)


def _check_indices(expr, captured, slot: int):
    """Debug builds: every captured-tensor index ``i`` (after wrapping) becomes ``CheckIndex(i, n, d, slot)``,
    checked at run time against the size launch.py writes into the bounds record (ATTNGEN_DEBUG=1), passed
    as captured tensor ``slot``."""
    number = {c.name: n for n, c in enumerate(captured)}

    def rep(e):
        n = number.get(e.args[0].name)
        if n is None:
            return e  # summary arrays: sized by the kernel's own block counts
        return e.func(e.args[0], *[CheckIndex(i, n, d, slot) for d, i in enumerate(e.args[1:])])

    return sympy.sympify(expr).replace(lambda e: isinstance(e, Load), rep)


def _flatten_loads(expr, strides):
    """Load(t, i0, i1) -> FlatLoad(t, i0*s0 + i1*s1), distributed so per-row/-column parts separate."""

    def rep(e):
        name = e.args[0].name
        if name not in strides:
            return e  # summary arrays stay 1-D loads
        idx = e.args[1:]
        if len(idx) != len(strides[name]):
            raise BuildError(
                f"load `{e}` indexes captured tensor {name} with {len(idx)} indices, but it has rank "
                f"{len(strides[name])}; a mod must index every dimension (e.g. bias[h, q_idx])"
            )
        off = sympy.Add(*[sympy.expand_mul(i * s, deep=False) for i, s in zip(idx, strides[name])])
        return (FlatILoad if isinstance(e, ILoad) else FlatLoad)(e.args[0], off)

    return expr.replace(lambda e: isinstance(e, Load), rep)


# The relative position q_idx - kv_idx, the argument of score_rel.
REL_D = sympy.Symbol("d", integer=True)
REL_FD = sympy.Symbol("fd", real=True)  # float(d), as score_rel receives it


def _has_rel_loads(expr) -> bool:
    """Whether ``expr`` reads a captured tensor at an index that depends on d (score_tile_rel clamps d then)."""
    return any(REL_D in x.free_symbols for x in expr.atoms(Load) | expr.atoms(FlatLoad))


def _relative_terms(score):
    """(a, b) with ``score == SCORE * a + b``, a and b functions of the relative position ``REL_D`` = q_idx -
    kv_idx (and of b, h) and at least one of them depending on it; None when the score has another form.
    Structural: ``q_idx`` is replaced by ``d + kv_idx`` and sympy's automatic evaluation must cancel
    ``kv_idx`` (alibi's ``slope*(kv - q)``, ``table[h, q - kv + L]``, ``s / (1 + c (q - kv)**2)``)."""
    if SCORE not in score.free_symbols:
        return None
    b, with_score = score.as_independent(SCORE, as_Add=True)
    a, rest = with_score.as_independent(SCORE, as_Add=False)
    if rest != SCORE:
        return None
    a, b = (sympy.sympify(x).xreplace({Q: REL_D + KV}) for x in (a, b))
    free = a.free_symbols | b.free_symbols
    if SCORE in free or KV in free or Q in free or REL_D not in free:
        return None
    return _float_d(a), _float_d(b)


def _float_d(e):
    """Integer polynomials of d alone inside float sums / products evaluated in float on ``fd`` = float(d):
    ``slope * d`` -> ``slope * fd``, ``1e-4 * d**2`` -> ``1e-4 * fd**2``. The same values while |d| < 2**24
    (the int square, unlike the float one, overflows past |d| = 46340), and no conversion per call."""
    if e.is_Atom or not e.args:
        return e
    args = [_float_d(x) for x in e.args]
    if (e.is_Add or e.is_Mul) and not e.is_integer:
        args = [_on_fd(x) for x in args]
    elif (e.is_Pow and not (e.exp.is_Integer and e.exp > 0)) or isinstance(e, ToFloat):
        args[0] = _on_fd(args[0])  # 1 / (1 + d**2), float(d * d): the base / argument is used as a float
    return e.func(*args) if args != list(e.args) else e


def _on_fd(x):
    """An integer polynomial of d alone, evaluated on fd instead; anything else as it is."""
    return x.xreplace({REL_D: REL_FD}) if x.is_integer and x.free_symbols == {REL_D} and _int_poly(x) else x


def _int_poly(e) -> bool:
    if e.is_Atom:
        return e == REL_D or e.is_Integer
    if e.is_Pow:
        return e.exp.is_Integer and e.exp > 0 and _int_poly(e.base)
    return (e.is_Add or e.is_Mul) and all(_int_poly(x) for x in e.args)


def _linear_slope(b):
    """beta where ``b == beta * fd + b(0)`` with beta free of d and fd (alibi's ``slope * fd``), else None: the
    kernel then computes b at fd0 - k as ``b(fd0) - k * beta``, one FFMA instead of a subtraction and a product."""
    if REL_D in b.free_symbols or REL_FD not in b.free_symbols:
        return None
    beta = sympy.diff(b, REL_FD)
    if beta.free_symbols & {REL_D, REL_FD} or sympy.expand(b - beta * REL_FD - b.xreplace({REL_FD: 0})) != 0:
        return None
    return beta


class _Emitter:
    """Holds the printing context shared by all generated functions."""

    def __init__(self, traced: TracedVariant, preds: BlockPredicates, fast_tanh: bool, fast_exp2: bool,
                 fast_div: bool = False):
        self.captured = [(c.name, c.dtype) for c in traced.captured]
        self.summaries = [(s.name, s.integer) for s in preds.summaries]
        names = [n for n, _ in self.captured] + [n for n, _ in self.summaries]
        if len(set(names)) != len(names):
            raise BuildError(f"captured tensors and summaries must have distinct names, got {names}")
        if len(self.captured) > MAX_CAPTURED or len(self.summaries) > MAX_SUMMARIES:
            raise BuildError(
                f"a variant may capture at most {MAX_CAPTURED} tensors and use at most {MAX_SUMMARIES} runtime "
                f"summaries (ATTNGEN_MAX_CAPTURED/ATTNGEN_MAX_SUMMARIES), got {len(self.captured)} and "
                f"{len(self.summaries)}; index fewer captured tensors by q_idx/kv_idx (or merge them into one)"
            )
        self.fast_tanh, self.fast_exp2, self.fast_div = fast_tanh, fast_exp2, fast_div
        self.types: Dict[sympy.Symbol, str] = {}

    def printer(self, names: Dict[sympy.Symbol, str]) -> CudaPrinter:
        return CudaPrinter(self.fast_tanh, self.fast_exp2, captured=dict(self.captured), summaries=dict(self.summaries),
                           symbol_names=names, local_types=self.types, fast_div=self.fast_div)

    def body(self, p: CudaPrinter, outputs: Sequence[Tuple[sympy.Basic, str]], indent: str = "  ") -> Tuple[List[str], List[str]]:
        """CSE over ``outputs`` ((expr, type) pairs). Returns (temporary declarations, output texts)."""
        temps, reduced = sympy.cse([e for e, _ in outputs], symbols=sympy.numbered_symbols("x"), order="canonical")
        lines = []
        for sym, d in temps:
            t = p.typeof(d)
            lines.append(f"{indent}const {C_TYPES[t]} {sym.name} = {p.doprint(d)};")
            p.declare(sym, t)
        outs = []
        for (orig, t), r in zip(outputs, reduced):
            rt = p.typeof(r)
            if t == INT and rt not in (INT, LL, BOOL):
                raise BuildError(f"block bound `{orig}` is not an integer expression (prints as {rt}); "
                                 "block predicates must use integer arithmetic (floor division, Min/Max)")
            outs.append(p.doprint(r, as_type=t))
        return lines, outs


def _elem_body(p: CudaPrinter, temps, expr, indent="  ") -> List[str]:
    """Declarations of the element-level CSE temporaries ``expr`` needs, in order."""
    need = set(expr.free_symbols)
    for sym, d in reversed(temps):
        if sym in need:
            need |= d.free_symbols
    lines = []
    for sym, d in temps:
        if sym in need:
            t = p.typeof(d)
            lines.append(f"{indent}const {C_TYPES[t]} {sym.name} = {p.doprint(d)};")
            p.declare(sym, t)
    return lines


# ---- score_mod gradients (backward kernels; the forward kernels never call these functions) -------------


def _hoist_gradients(traced: TracedVariant, prepare, check, hoist: "_Hoister"):
    """d score_mod / d score and the gradient sites of ``gradients.derive_gradients``, prepared like score_mod
    (``prepare``: wrapped, checked in debug builds, flat offsets), each passed to ``check`` (a printer: raises
    BuildError for what cannot be printed) before any is hoisted with the same hoister, so that a failure
    leaves the context structs as they were; hoisted, their per-head / -row / -column parts join the context
    structs (new fields after score_mod's, shared where equal). Returns (dscore, ((slot, load, derivative,
    offset, kind), ...)) with ``grad_site_kinds``' kind; no work for a variant without score_mod, so its contexts keep exactly their fields."""
    if traced.score == SCORE:
        return sympy.Integer(1), ()
    grads = derive_gradients(traced)
    slot = {c.name: n for n, c in enumerate(traced.captured)}
    dscore = prepare(grads.dscore)
    sites = [(slot[site.tensor], site.load, prepare(site.derivative),
              prepare(site.load).args[1])  # FlatLoad(t, offset): the element offset with the captured strides
             for site in grads.sites]
    for e in [dscore] + [x for _, _, d, off in sites for x in (d, off)]:
        check(e)
    kinds = grad_site_kinds([off for _, _, _, off in sites])
    return hoist.top(dscore), tuple((sl, load, hoist.top(d), hoist.top(off), kind)
                                    for (sl, load, d, off), kind in zip(sites, kinds))


# How the sm90 backward sums a gradient site over a tile before it reaches global memory (bwd_grad_sites.cuh):
# one value per tile when the element's offset reads neither q_idx nor kv_idx, one per diagonal when it reads
# q_idx - kv_idx only (shared-memory bins, at most GRAD_DIAG_SITES of them: more would take the room of the
# kernel's staged dQ at head dim 128, sm90_bwd_layout.cuh), else one atomic add per element.
GRAD_SITE_ELEM, GRAD_SITE_TILE, GRAD_SITE_DIAG = 0, 1, 2
GRAD_DIAG_SITES = 3


def grad_site_kinds(offsets) -> Tuple[int, ...]:
    """The kind of each site from its element offset (before hoisting). Structural, like ``_relative_terms``:
    ``q_idx`` is replaced by ``d + kv_idx`` and sympy's automatic evaluation must cancel ``kv_idx``. An offset
    that reads the score (``t[h, where(s > 0, 1, 0)]``) is per element: the sums per tile and per diagonal take
    one offset for elements of different scores."""
    kinds, diag = [], 0
    for off in offsets:
        off = sympy.sympify(off)
        free = off.free_symbols
        if SCORE in free:
            kinds.append(GRAD_SITE_ELEM)
        elif Q not in free and KV not in free:
            kinds.append(GRAD_SITE_TILE)
        elif diag < GRAD_DIAG_SITES and KV not in off.xreplace({Q: REL_D + KV}).free_symbols:
            kinds.append(GRAD_SITE_DIAG)
            diag += 1
        else:
            kinds.append(GRAD_SITE_ELEM)
    return tuple(kinds)


def _gradient_functions(em: "_Emitter", ctx_names, elem_params: str, dscore, sites) -> List[str]:
    """score_mod_grad, grad_site and grad_site_slot (docs/kernel-interface.md): CSE over all of them, each
    function (and each case of grad_site) declaring the temporaries it needs."""
    outputs = [dscore] + [x for _, _, d, off, _ in sites for x in (d, off)]
    temps, reduced = sympy.cse(outputs, symbols=sympy.numbered_symbols("x"), order="canonical")
    p = em.printer(ctx_names)
    lines = _elem_body(p, temps, reduced[0])
    funcs = [
        "// d score_mod / d score at `score` (the scaled q.k score_mod receives), recomputed by the backward kernels\n"
        f"__device__ __forceinline__ float score_mod_grad(float score, {elem_params}) {{\n"
        + "".join(x + "\n" for x in lines) + f"  return {p.doprint(reduced[0], as_type=FLOAT)};\n}}"
    ]
    notes, cases = [], []
    for k, (slot, load, _, _, _) in enumerate(sites):
        d_r, off_r = reduced[1 + 2 * k], reduced[2 + 2 * k]
        pk = em.printer(ctx_names)
        lines = _elem_body(pk, temps, sympy.Tuple(d_r, off_r), indent="    ")
        notes.append(f"//   site {k}: {_comment(load)}, captured slot {slot}")
        cases.append(f"  case {k}: {{\n" + "".join(x + "\n" for x in lines)
                     + f"    offset = {pk.doprint(off_r, as_type=LL)};\n"
                     + f"    return {pk.doprint(d_r, as_type=FLOAT)};\n  }}\n")
    funcs.append(
        "// Site k in [0, ATTNGEN_NUM_GRAD_SITES): d score_mod / d the captured element the site reads, and that\n"
        "// element's offset from c.ptr[grad_site_slot(k)] in elements, with the captured strides (the kernel adds\n"
        "// dS_mod * derivative to the tensor's gradient there).\n" + "".join(n + "\n" for n in notes)
        + f"__device__ __forceinline__ float grad_site(int k, float score, {elem_params}, long long& offset) {{\n"
        + "  switch (k) {\n" + "".join(cases) + "  default:\n    offset = 0;\n    return 0.0f;\n  }\n}"
    )
    slots = "".join(f"k == {k} ? {slot} : " for k, (slot, _, _, _, _) in enumerate(sites))
    funcs.append("// the captured-tensor slot of site k (-1 past the last site)\n"
                 f"__device__ __forceinline__ constexpr int grad_site_slot(int k) {{\n  return {slots}-1;\n}}"
                 if sites else
                 "// the captured-tensor slot of site k (-1: this variant has no sites)\n"
                 "__device__ __forceinline__ constexpr int grad_site_slot(int /*k*/) {\n  return -1;\n}")
    kinds = [kind for *_, kind in sites]
    bins = [sum(1 for x in kinds[:k] if x == GRAD_SITE_DIAG) for k in range(len(kinds))]
    kind_of = "".join(f"k == {k} ? {kind} : " for k, kind in enumerate(kinds) if kind != GRAD_SITE_ELEM)
    bin_of = "".join(f"k == {k} ? {b} : " for k, (kind, b) in enumerate(zip(kinds, bins)) if kind == GRAD_SITE_DIAG)
    funcs.append(
        "// How the sm90 backward sums site k over a tile (bwd_grad_sites.cuh): 0 per element, 1 once per tile (the\n"
        "// offset reads neither q_idx nor kv_idx), 2 once per diagonal (it reads q_idx - kv_idx only), in bin set\n"
        "// grad_site_bin(k) of ATTNGEN_GRAD_DIAG_SITES.\n"
        f"__device__ __forceinline__ constexpr int grad_site_kind(int k) {{\n  return {kind_of}0;\n}}\n\n"
        f"__device__ __forceinline__ constexpr int grad_site_bin(int k) {{\n  return {bin_of}-1;\n}}")
    return funcs


def render_variant_inc(traced: TracedVariant, preds: BlockPredicates, *, fast_tanh: bool = True,
                       fast_exp2: bool = True, debug: bool = False, fast_div: bool = True) -> str:
    """The ``variant.inc`` of docs/kernel-interface.md for ``traced`` and its block predicates.

    fast_tanh / fast_exp2 select ``tanh.approx.f32`` / ``ex2.approx.ftz.f32`` (see ``CudaPrinter``), fast_div
    ``rcp.approx`` (variant_math.cuh's ag_fdiv) for a mod's float division.
    Raises BuildError for expressions the printers cannot express, naming the node.
    """
    em = _Emitter(traced, preds, fast_tanh, fast_exp2, fast_div)
    cap_names = [n for n, _ in em.captured]
    sum_names = [n for n, _ in em.summaries]
    # runtime parameters become reads of their CapturedArgs slots, printed verbatim and typed by assumptions
    param_reads = _param_reads(traced)
    score = sympy.sympify(traced.score).xreplace(param_reads)
    mask = sympy.sympify(traced.mask).xreplace(param_reads)
    param_syms = tuple(param_reads.values())
    _check_symbols("score_mod", score, (SCORE, B, H, Q, KV) + param_syms, cap_names + sum_names)
    _check_symbols("mask_mod", mask, (B, H, Q, KV) + param_syms, cap_names + sum_names)
    if mask.is_Atom and mask not in (sympy.true, sympy.false):
        raise BuildError(f"mask `{mask}` must be a boolean expression (e.g. q_idx >= kv_idx) or sympy.true")

    # ---- element level: hoist into Head/Row/Col contexts ------------------------------------------------
    strides = _stride_symbols(traced)
    for ss in strides.values():
        for s in ss:
            em.types[s] = LL
    levels = {SCORE: ELEM, Q: ROW, KV: COL, B: HEAD, H: HEAD, REL_D: ELEM, REL_FD: ELEM}
    levels.update({s: HEAD for s in param_syms})  # one value per launch: per-head work at most
    levels.update({s: HEAD for ss in strides.values() for s in ss})
    hoist = _Hoister(levels)
    debug_slot = len(traced.captured)  # debug builds: the bounds record rides in the first free captured slot
    checked = debug and traced.captured
    if checked and debug_slot >= MAX_CAPTURED:
        raise BuildError(f"a debug build (ATTNGEN_DEBUG=1) needs a free captured-tensor slot for its bounds record, "
                         f"but the variant captures {MAX_CAPTURED} tensors; build it without ATTNGEN_DEBUG")

    def prepare(e):
        """An element-level expression as the printers take it: negative indices wrapped, indices checked in
        debug builds, integer division lowered, loads flattened to offsets."""
        e = _wrap_indices(e.xreplace(param_reads), traced.captured)
        if checked:
            e = _check_indices(e, traced.captured, debug_slot)
        return _flatten_loads(lower_int_division(e), strides)

    score_f = prepare(score)
    score_l = hoist.top(score_f)
    mask_l = hoist.top(prepare(mask))

    # score_mod(s) = a * s with a per-head (or constant) factor: the kernel folds a into the per-tile factor
    # scale * log2(e) and multiplies once per element (score_mask.cuh) instead of calling score_mod
    head_scale = None
    if score_l.is_Mul and SCORE in score_l.args:
        a = score_l / SCORE
        if SCORE not in a.free_symbols and hoist.level(a) in (CONST, HEAD):
            head_scale = a
    # score_mod(s) = s * a(d) + b(d) with d = q_idx - kv_idx: the sm90 kernel evaluates a and b once per
    # distinct d of its fragment (about half its elements) and applies them with one FFMA (score_mask.cuh);
    # hoisted here, before the context structs are printed, so that their per-head parts join HeadCtx
    rel = None if head_scale is not None else _relative_terms(score_f)
    rel_hoisted = tuple(hoist.top(x) for x in rel) if rel is not None else None
    rel_slope = _linear_slope(rel_hoisted[1]) if rel_hoisted is not None else None
    # the backward kernels' derivatives, hoisted here too (new context fields only for variants with a score_mod)
    # A score_mod without derivatives (a construct gradients.py has no rule for, or one the printer cannot print)
    # still gets its forward: gradients.py and the printer run before anything is hoisted, the gradient functions
    # are left out and backward kernels stop at their #error (bwd_probs.cuh).
    trial = em.printer({SCORE: "score", Q: "q_idx", KV: "kv_idx", B: "b", H: "h"})
    try:
        grad_dscore, grad_sites = _hoist_gradients(traced, prepare, trial.doprint, hoist)
        grad_error = None
    except BuildError as e:
        grad_dscore, grad_sites, grad_error = None, (), str(e)

    ctx_names = {SCORE: "score", Q: "q_idx", KV: "kv_idx", B: "hc.b", H: "hc.h"}
    out: List[str] = []
    structs: List[str] = []
    funcs: List[str] = []

    # HeadCtx always carries b and h: row/col/element code reaches them as hc.b / hc.h.
    level_spec = {
        HEAD: ("HeadCtx", "hc", "head_ctx", "const CapturedArgs& c, int b, int h", {**ctx_names, B: "b", H: "h"}),
        ROW: ("RowCtx", "rc", "row_ctx", "const CapturedArgs& c, const HeadCtx& hc, int q_idx", ctx_names),
        COL: ("ColCtx", "cc", "col_ctx", "const CapturedArgs& c, const HeadCtx& hc, int kv_idx", ctx_names),
    }
    for L in (HEAD, ROW, COL):
        sname, var, fname, params, names = level_spec[L]
        p = em.printer(names)
        defs = hoist.defs[L]
        fields = ["  int b, h;"] if L == HEAD else []
        body = [f"  {sname} {var}{{}};"] + (["  hc.b = b;", "  hc.h = h;"] if L == HEAD else [])
        if defs:
            temps, reduced = sympy.cse([d for _, d in defs], symbols=sympy.numbered_symbols("x"), order="canonical")
            for tsym, td in temps:
                tt = p.typeof(td)
                body.append(f"  const {C_TYPES[tt]} {tsym.name} = {p.doprint(td)};")
                p.declare(tsym, tt)
            for (sym, d), r in zip(defs, reduced):
                t = p.typeof(r)
                fields.append(f"  {C_TYPES[t]} {sym.name.split('.')[1]};  // {_comment(d)}")
                body.append(f"  {sym.name} = {p.doprint(r)};")
                em.types[sym] = t
        body.append(f"  return {var};")
        structs.append(f"struct {sname} {{\n" + "".join(f + "\n" for f in fields) + "};")
        funcs.append(f"__device__ __forceinline__ {sname} {fname}({params}) {{\n" + "\n".join(body) + "\n}")

    # element functions: CSE over score and mask together, each function declares what it needs
    temps, (score_r, mask_r) = sympy.cse([score_l, mask_l], symbols=sympy.numbered_symbols("x"), order="canonical")
    ps = em.printer(ctx_names)
    s_lines = _elem_body(ps, temps, score_r)
    s_text = ps.doprint(score_r, as_type=FLOAT)
    pm = em.printer(ctx_names)
    m_lines = _elem_body(pm, temps, mask_r)
    m_text = pm.doprint(mask_r, as_type=BOOL)
    elem_params = "const CapturedArgs& c, const HeadCtx& hc, const RowCtx& rc, const ColCtx& cc,\n    int q_idx, int kv_idx"
    funcs.append(
        f"__device__ __forceinline__ float score_mod(float score, {elem_params}) {{\n"
        + "".join(x + "\n" for x in s_lines) + f"  return {s_text};\n}}"
    )
    funcs.append(
        f"__device__ __forceinline__ bool mask_mod({elem_params}) {{\n"
        + "".join(x + "\n" for x in m_lines) + f"  return {m_text};\n}}"
    )
    if head_scale is not None:
        ph = em.printer(ctx_names)
        funcs.append(
            "__device__ __forceinline__ float score_head_scale(const CapturedArgs& c, const HeadCtx& hc) {\n"
            f"  return {ph.doprint(head_scale, as_type=FLOAT)};\n}}"
        )
    if rel_hoisted is not None:
        temps_r, (a_r, b_r) = sympy.cse(list(rel_hoisted), symbols=sympy.numbered_symbols("x"), order="canonical")
        pr = em.printer({**ctx_names, REL_D: "d", REL_FD: "fd"})
        r_lines = _elem_body(pr, temps_r, sympy.Tuple(a_r, b_r))
        funcs.append(
            "struct RelTerms {\n  float a, b;  // score_mod(s) = a s + b\n};\n\n"
            "// d = q_idx - kv_idx, fd = float(d) (the kernel derives it without a conversion per call)\n"
            "__device__ __forceinline__ RelTerms score_rel(const CapturedArgs& c, const HeadCtx& hc, int d, float fd) {\n"
            + "".join(x + "\n" for x in r_lines)
            + f"  return {{{pr.doprint(a_r, as_type=FLOAT)}, {pr.doprint(b_r, as_type=FLOAT)}}};\n}}"
        )
        if rel_slope is not None:
            funcs.append(
                "// b(fd) = score_rel_slope * fd + b(0): the kernel steps b along a thread's columns, one FFMA each\n"
                "__device__ __forceinline__ float score_rel_slope(const CapturedArgs& c, const HeadCtx& hc) {\n"
                f"  return {pr.doprint(rel_slope, as_type=FLOAT)};\n}}"
            )

    if grad_error is None:
        try:
            funcs += _gradient_functions(em, ctx_names, elem_params, grad_dscore, grad_sites)
        except BuildError as e:
            grad_error = str(e)

    # ---- tile level ------------------------------------------------------------------------------------
    # The forward kernels read the kv-block ranges of each q-block and the tile classifier; the backward
    # kernel walks the transposed ranges (the q blocks of kv-block j: q_lo ...) with the same classifier.
    tile_names = {I: "i", J: "j", BQ: "BQ", BK: "BK", QLEN: "t.QLEN", KVLEN: "t.KVLEN", QOFF: "t.QOFF", B: "t.b", H: "t.h"}
    common = (BQ, BK, QLEN, KVLEN, QOFF, B, H)
    arrays = cap_names + sum_names
    tile_specs = [
        ("kv_block_lo", "int", "int i", preds.kv_lo, (I,) + common),
        ("kv_block_hi", "int", "int i", preds.kv_hi, (I,) + common),
        ("kv_full_lo", "int", "int i", preds.kv_full_lo, (I,) + common),
        ("kv_full_hi", "int", "int i", preds.kv_full_hi, (I,) + common),
        ("tile_any", "bool", "int i, int j", preds.tile_any, (I, J) + common),
        ("tile_all", "bool", "int i, int j", preds.tile_all, (I, J) + common),
        ("q_block_lo", "int", "int j", preds.q_lo, (J,) + common),
        ("q_block_hi", "int", "int j", preds.q_hi, (J,) + common),
        ("q_full_lo", "int", "int j", preds.q_full_lo, (J,) + common),
        ("q_full_hi", "int", "int j", preds.q_full_hi, (J,) + common),
    ]
    # Parameters print as their slot reads by name: substituting them would rebuild (and re-evaluate) every
    # node above them, which on a union's tile expressions takes minutes or meets Min/Max comparisons sympy
    # cannot decide.
    tile_names.update({sym: name.name for sym, name in param_reads.items()})
    tile_params = tuple(param_reads)

    def tile_expr(what, expr, allowed, integer=True):
        expr = sympy.sympify(expr)
        _check_symbols(what, expr, allowed + tile_params, arrays)
        if integer:
            expr = expr.xreplace({sympy.oo: sympy.Integer(_BIG), -sympy.oo: sympy.Integer(-_BIG)})
        return lower_int_division(_wrap_indices(expr, traced.captured))

    tile_funcs = []
    for fname, rtype, params, expr, allowed in tile_specs:
        p = em.printer(tile_names)
        expr = tile_expr(f"block predicate {fname}", expr, allowed, integer=rtype == "int")
        lines, (text,) = em.body(p, [(expr, INT if rtype == "int" else BOOL)])
        tile_funcs.append(
            f"template <int BQ, int BK>\n__device__ __forceinline__ {rtype} {fname}(const CapturedArgs& c, const TileArgs& t, {params}) {{\n"
            + "".join(x + "\n" for x in lines) + f"  return {text};\n}}"
        )
    # a union mask's ranges, one per disjunct (block_parts.cuh walks them)
    for fname, param, parts, allowed in (("kv_parts", "int i", preds.kv_parts, (I,) + common),
                                         ("q_parts", "int j", preds.q_parts, (J,) + common)):
        if not parts:
            continue
        n = len(parts)
        p = em.printer(tile_names)
        outputs = [(tile_expr(f"block predicate {fname}", e, allowed), INT) for part in parts for e in part]
        lines, texts = em.body(p, outputs)
        stores = [f"  {arr}[{k}] = {texts[4 * k + a]};" for k in range(n) for a, arr in enumerate(("lo", "hi", "flo", "fhi"))]
        tile_funcs.append(
            f"template <int BQ, int BK>\n__device__ __forceinline__ void {fname}(const CapturedArgs& c, const TileArgs& t, "
            f"{param}, int (&lo)[{n}], int (&hi)[{n}], int (&flo)[{n}], int (&fhi)[{n}]) {{\n"
            + "".join(x + "\n" for x in lines + stores) + "}"
        )

    # ---- assemble --------------------------------------------------------------------------------------
    v = getattr(traced, "variant", None)
    # the key name: runtime parameters by name, since this text serves every value
    vname = getattr(v, "key_name", getattr(v, "name", "?")) if v is not None else "?"
    cap_desc = ", ".join(f"{c.name}: {c.dtype} rank {c.rank}"
                         + "".join(f", dim {d} wraps at {n}" for d, n in c.wrapped_dims) for c in traced.captured) or "none"
    sum_desc = ", ".join(f"{s.name}: per {s.axis}-block {'int32' if s.integer else 'float32'}"
                         + (f" ({s.key})" if s.key else "") for s in preds.summaries) or "none"
    has_score = int(score != SCORE)
    has_mask = int(mask is not sympy.true)
    out += [
        "// variant.inc -- generated by attngen.codegen.render_variant_inc; do not edit.",
        f"// variant:   {_comment(vname)}",
        f"// score_mod: {_comment(score)}",
        f"// mask_mod:  {_comment(mask)}",
        f"// captured:  {_comment(cap_desc)}",
        f"// summaries: {_comment(sum_desc)}",
        f"// q-block i visits kv blocks [{_comment(preds.kv_lo)}, {_comment(preds.kv_hi)}), "
        f"full [{_comment(preds.kv_full_lo)}, {_comment(preds.kv_full_hi)})",
        *[f"// q-block i, part {k}: visits [{_comment(lo)}, {_comment(hi)}), full [{_comment(flo)}, {_comment(fhi)})"
          for k, (lo, hi, flo, fhi) in enumerate(preds.kv_parts)],
        f"// tile_any: {_comment(preds.tile_any)}",
        f"// tile_all: {_comment(preds.tile_all)}",
        f"// fast paths: tanh.approx={int(fast_tanh)} ex2.approx={int(fast_exp2)} rcp.approx={int(fast_div)}",
        "// Needs attngen_common.cuh (CapturedArgs, TileArgs, py_floordiv, py_mod) included first, and",
        "// variant_math.cuh (the ag_* helpers) beside it.",
        "#pragma once",
        "#ifndef ATTNGEN_MAX_CAPTURED",
        '#error "attngen: include attngen_common.cuh before variant.inc"',
        "#endif",
        '#include "variant_math.cuh"',
        "",
        f"#define ATTNGEN_HAS_SCORE_MOD {has_score}",
        f"#define ATTNGEN_SCORE_HEAD_SCALE {int(head_scale is not None)}",
        f"#define ATTNGEN_SCORE_REL {int(rel is not None)}",
        f"#define ATTNGEN_SCORE_REL_LOADS {int(rel is not None and _has_rel_loads(sympy.Tuple(*rel)))}",
        # score_mod(s) = a(d) s: the softmax applies the scale (score_mask.cuh's score_tile_rel)
        f"#define ATTNGEN_SCORE_REL_SCALES {int(rel is not None and rel[1] == 0)}",
        f"#define ATTNGEN_SCORE_REL_LINEAR {int(rel_slope is not None)}",
        # a does not depend on d (s + table[h, q - kv]): the kernels stage b alone per diagonal (score_mask.cuh)
        f"#define ATTNGEN_SCORE_REL_A_CONST {int(rel is not None and not rel[0].free_symbols & {REL_D, REL_FD})}",
        f"#define ATTNGEN_HAS_MASK {has_mask}",
        f"#define ATTNGEN_NEEDS_CLASSIFIER {int(bool(preds.needs_classifier))}",
        f"#define ATTNGEN_KV_PARTS {len(preds.kv_parts) if has_mask else 0}",
        f"#define ATTNGEN_Q_PARTS {len(preds.q_parts) if has_mask else 0}",
        f"#define ATTNGEN_NUM_SUMMARIES {len(preds.summaries)}",
        f"#define ATTNGEN_TILES_READ_HEAD {int(has_mask and preds.walk_reads(H))}",
        *([f"#define ATTNGEN_NUM_GRAD_SITES {len(grad_sites)}",
           f"#define ATTNGEN_GRAD_DIAG_SITES {sum(1 for *_, kind in grad_sites if kind == GRAD_SITE_DIAG)}"]
          if grad_error is None else [f"// no score_mod gradients (backward kernels unavailable): {_comment(grad_error)}"]),
        "",
    ]
    if debug and traced.captured:
        out += ["// debug build (ATTNGEN_DEBUG=1): captured-tensor indices are checked by ag_chk; launch.py passes the",
                "// bounds record in this captured-tensor slot (host_abi.cuh exports it as attngen_debug_slot).",
                f"#define ATTNGEN_DEBUG_SLOT {debug_slot}", ""]
    out += ["// ---- per-head / per-row / per-column terms (hoisted out of the element functions)"]
    for s in structs:
        out += [s]
    out += [""]
    for f in funcs:
        out += [f, ""]
    out += ["// ---- tile level (BQ x BK tiles; i = q-block, j = kv-block)"]
    for f in tile_funcs:
        out += [f, ""]
    return "\n".join(out)
