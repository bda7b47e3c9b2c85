"""TracedVariant -> ScoreGradients: the derivatives of a score_mod that a backward kernel recomputes per element.

At every kept score element the backward pass needs
  * ``dscore``: d score_mod / d score at the (already scaled) score score_mod received, for the chain rule
    into dS; and
  * one ``GradSite`` per distinct float captured-tensor element the score_mod reads (``slopes[h]``,
    ``table[h, q_idx - kv_idx + L - 1]``, ``bias[q_idx, kv_idx]``): d score_mod / d that element, so the kernel
    can add ``dS_mod * derivative`` to the tensor's gradient at the element's offset.

Both come from the chain rule over ``TracedVariant.score`` (sympy's derivative of each function node), with
every distinct float ``Load`` replaced by an independent real symbol (then put back), so a tensor read twice at
one index gets one site whose derivative sums both uses. Integer tensors (``ILoad``) are not differentiable and
get no site; neither does a load whose derivative is identically 0 (read only through an integer-valued part).

At points where the score_mod is not differentiable, the derivatives follow torch autograd almost everywhere:
  * integer-valued subexpressions (``//``, ``%`` of integers, floor/ceil, sign, integer loads, a condition
    used as 0/1) have derivative 0;
  * ``abs(x)`` has derivative ``sign(x)`` (0 at 0, as torch);
  * where/Piecewise differentiate branch by branch under the same conditions;
  * ``minimum``/``maximum``/``clamp`` pass the derivative of the argument they pick (at a tie one of them;
    torch splits a tie evenly, or passes it through clamp: a set of measure zero);
  * float ``a % b`` is ``a - b * floor(a / b)`` (torch.remainder's gradient);
  * a constant power is ``p b**(p-1) db`` (finite at b = 0 for p >= 1), and sigmoid's is ``-e (1 - e) du``,
    finite where exp overflows fp32.
No simplification beyond sympy's automatic one, so the derivation is fast and its output deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, NamedTuple, Tuple

import sympy

from .errors import BuildError
from .symbols import SCORE, ILoad, Load

if TYPE_CHECKING:  # ir imports torch; this stage needs only sympy
    from .ir import TracedVariant

__all__ = ["GradSite", "ScoreGradients", "derive_gradients", "score_gradients"]


class GradSite(NamedTuple):
    """One float captured-tensor element a score_mod reads, and d score_mod / d that element."""

    tensor: str  # the captured tensor's name, 't0', 't1', ...
    index: Tuple[sympy.Expr, ...]  # the load's index expressions as traced (negative ones not yet wrapped)
    derivative: sympy.Expr  # in SCORE, B, H, Q, KV and loads, like TracedVariant.score

    @property
    def load(self) -> sympy.Expr:
        """The element as the ``Load`` node of the score expression."""
        return Load(sympy.Symbol(self.tensor), *self.index)


@dataclass(frozen=True)
class ScoreGradients:
    """Derivatives of ``TracedVariant.score``; for a variant without score_mod, ``dscore`` is 1 and no sites."""

    dscore: sympy.Expr  # d score_mod / d SCORE
    sites: Tuple[GradSite, ...] = ()  # in the order of sympy's default_sort_key of their loads


def derive_gradients(traced: "TracedVariant") -> ScoreGradients:
    """The ScoreGradients of a traced variant's score expression."""
    return score_gradients(traced.score)


def score_gradients(score) -> ScoreGradients:
    """The ScoreGradients of a score expression in SCORE, B, H, Q, KV and Load/ILoad nodes.

    Raises BuildError naming the sub-expression when a part of it cannot be differentiated."""
    score = sympy.sympify(score)
    loads = sorted((x for x in score.atoms(Load) if not isinstance(x, ILoad)), key=sympy.default_sort_key)
    # names no traced expression contains (symbols.py and the t<N> array names are all it uses)
    stand_in = {ld: sympy.Symbol(f"_ag_load{k}", real=True) for k, ld in enumerate(loads)}
    expr = score.xreplace(stand_in)  # top-down: a load inside another load's index disappears with it
    put_back = {s: ld for ld, s in stand_in.items()}
    dscore = _Differentiator(SCORE, score, put_back).d(expr).xreplace(put_back)
    sites = []
    for ld in loads:
        x = stand_in[ld]
        if x in expr.free_symbols:
            d = _Differentiator(x, score, put_back).d(expr).xreplace(put_back)
            if d != 0:
                sites.append(GradSite(ld.args[0].name, tuple(ld.args[1:]), d))
    return ScoreGradients(dscore, tuple(sites))


class _Differentiator:
    """Forward-mode chain rule over a sympy tree, d/dx of each node (memoised), with the rules of the module
    docstring. Written out rather than ``sympy.diff`` so that non-smooth nodes get torch's derivatives and
    constant powers give ``p b**(p-1)`` (sympy's ``p b**p / b`` is 0/0 at b = 0)."""

    def __init__(self, x: sympy.Symbol, score, put_back):
        self.x, self.score, self.put_back = x, score, put_back
        self._memo: Dict[sympy.Basic, sympy.Expr] = {}

    def d(self, e) -> sympy.Expr:
        r = self._memo.get(e)
        if r is None:
            r = self._memo[e] = self._d(e)
        return r

    def _d(self, e) -> sympy.Expr:
        if e == self.x:
            return sympy.Integer(1)
        if self.x not in e.free_symbols or e.is_integer:
            return sympy.Integer(0)  # constant, or piecewise constant (floor, //, %, sign, int loads, 0/1)
        if e.is_Add:
            return sympy.Add(*[self.d(a) for a in e.args])
        if e.is_Mul:
            terms = []
            for k, a in enumerate(e.args):
                da = self.d(a)
                if da != 0:
                    terms.append(sympy.Mul(*e.args[:k], da, *e.args[k + 1:]))
            return sympy.Add(*terms)
        if e.is_Pow:
            return self._pow(e)
        if isinstance(e, sympy.Abs):
            (a,) = e.args
            return sympy.sign(a) * self.d(a)
        if isinstance(e, sympy.Mod):  # float remainder a - b floor(a / b)
            a, b = e.args
            return self.d(a) - sympy.floor(a / b) * self.d(b)
        if isinstance(e, (sympy.Min, sympy.Max)):
            return self._picked(e)
        if isinstance(e, sympy.Piecewise):
            return sympy.Piecewise(*[(self.d(v), c) for v, c in e.args])
        if isinstance(e, sympy.Function):
            return self._function(e)
        raise self._error(e, f"{type(e).__name__} nodes have no derivative rule")

    def _pow(self, e) -> sympy.Expr:
        b, p = e.args
        db, dp = self.d(b), self.d(p)
        if dp == 0:
            u = _sigmoid_argument(b) if p == -1 else None
            if u is not None:  # e = sigmoid(-u): -e (1 - e) du, finite where exp(u) overflows fp32
                return -e * (1 - e) * self.d(u)
            return p * b ** (p - 1) * db
        if db == 0:
            return e * sympy.log(b) * dp
        return e * (sympy.log(b) * dp + p * db / b)

    def _picked(self, e) -> sympy.Expr:
        """Max(a, b, c) picks a where a >= b and a >= c, else b where b >= c, else c (Min with <=): the
        derivative of the picked argument, the first one at a tie."""
        rel = sympy.Ge if isinstance(e, sympy.Max) else sympy.Le
        args = e.args
        pairs = [(self.d(a), sympy.And(*[rel(a, o) for o in args[k + 1:]])) for k, a in enumerate(args[:-1])]
        return sympy.Piecewise(*pairs, (self.d(args[-1]), sympy.true))

    def _function(self, e) -> sympy.Expr:
        terms = []
        for k, a in enumerate(e.args):
            da = self.d(a)
            if da == 0:
                continue
            try:
                f = e.fdiff(k + 1)
            except Exception as err:  # noqa: BLE001 - sympy raises ArgumentIndexError and others
                raise self._error(e, f"sympy has no derivative of {type(e).__name__} ({err})") from None
            if f.atoms(*_UNDIFFERENTIATED):
                raise self._error(e, f"sympy has no derivative of {type(e).__name__}")
            terms.append(f * da)
        return sympy.Add(*terms)

    def _error(self, e, why: str) -> BuildError:
        what = "the score" if self.x == SCORE else f"the captured element {self.put_back[self.x]}"
        shown = e.xreplace(self.put_back)
        return BuildError(
            f"cannot differentiate `{shown}` with respect to {what} (in score_mod `{self.score}`): {why}; the "
            "backward kernel needs d score_mod / d score and d score_mod / d every float captured element. Fix: "
            "write that part of the score_mod with differentiable operations (+ - * /, powers, exp/log/tanh/sin/"
            "cos/tan/atan/erf/log1p/expm1/sqrt, abs, torch.where, torch.minimum/maximum/clamp); integer-valued "
            "parts (//, %, floor, sign, integer tensors) count as constants"
        )


_UNDIFFERENTIATED = (sympy.Derivative, sympy.Subs, sympy.DiracDelta, sympy.Heaviside)


def _sigmoid_argument(b):
    """u when ``b`` is 1 + exp(u) (torch.sigmoid traces to 1 / (1 + exp(-x))), else None."""
    if b.is_Add and len(b.args) == 2 and sympy.S.One in b.args:
        other = b.args[0] if b.args[1] == 1 else b.args[1]
        if isinstance(other, sympy.exp):
            return other.args[0]
    return None
