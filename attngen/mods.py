"""User-facing mod objects: MaskMod, ScoreMod and Variant.

A mod is an ordinary Python callable with FlexAttention's signature:
``score_mod(score, b, h, q_idx, kv_idx)`` and ``mask_mod(b, h, q_idx, kv_idx)``.
The same callable is evaluated on broadcast torch tensors (reference path, brute force)
and on symbolic proxies (tracing), so the library variants are written once.
MaskMod and ScoreMod only add names and composition on top of a plain function.
"""
from __future__ import annotations

import inspect
import math
import types
from dataclasses import dataclass
from typing import Callable, Optional, Tuple, Union

import torch

from .errors import ModSignatureError


def _is_symbolic(x) -> bool:
    return getattr(type(x), "_attngen_symbolic", False)


def _shim(name: str, torch_fn: Callable, math_fn: Callable) -> Callable:
    def f(x):
        if isinstance(x, torch.Tensor) or _is_symbolic(x):
            return torch_fn(x)
        return math_fn(x)

    f.__name__ = name
    f._attngen_math_shim = True
    return f


# math functions a mod may call on score/index values; each forwards to torch for tensors and proxies.
MATH_SHIMS = {
    math.tanh: _shim("tanh", torch.tanh, math.tanh),
    math.exp: _shim("exp", torch.exp, math.exp),
    math.log: _shim("log", torch.log, math.log),
    math.log2: _shim("log2", torch.log2, math.log2),
    math.sqrt: _shim("sqrt", torch.sqrt, math.sqrt),
    math.sin: _shim("sin", torch.sin, math.sin),
    math.cos: _shim("cos", torch.cos, math.cos),
    math.fabs: _shim("fabs", torch.abs, math.fabs),
    math.tan: _shim("tan", torch.tan, math.tan),
    math.atan: _shim("atan", torch.atan, math.atan),
    math.log1p: _shim("log1p", torch.log1p, math.log1p),
    math.expm1: _shim("expm1", torch.expm1, math.expm1),
    math.erf: _shim("erf", torch.erf, math.erf),
}
if hasattr(math, "exp2"):
    MATH_SHIMS[math.exp2] = _shim("exp2", torch.exp2, math.exp2)

_MATH_MODULE_SHIM = types.SimpleNamespace(
    **{**{k: v for k, v in vars(math).items() if not k.startswith("_")},
       **{fn.__name__: shim for fn, shim in MATH_SHIMS.items()}}
)


def with_math_shim(fn: Callable) -> Callable:
    """Return ``fn`` with its globals' ``math`` module and ``math.*`` functions replaced by shims
    that accept tensors and symbolic proxies. Only the mod's own globals are rewritten (a helper
    function it calls keeps the real ``math``: the tracer then reports it with the fix)."""
    if not isinstance(fn, types.FunctionType):
        return fn
    g = fn.__globals__
    repl = {}
    for name, val in g.items():
        if val is math:
            repl[name] = _MATH_MODULE_SHIM
        elif callable(val) and not isinstance(val, type):
            try:
                if val in MATH_SHIMS:
                    repl[name] = MATH_SHIMS[val]
            except TypeError:  # unhashable callables
                pass
    if not repl:
        return fn
    new_globals = dict(g)
    new_globals.update(repl)
    new = types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__wrapped__ = fn
    return new


MASK_SIGNATURE = "mask_mod(b, h, q_idx, kv_idx) -> bool"
SCORE_SIGNATURE = "score_mod(score, b, h, q_idx, kv_idx) -> score"
_ROLE_ARGS = {"mask_mod": 4, "score_mod": 5}
_ROLE_SIGNATURE = {"mask_mod": MASK_SIGNATURE, "score_mod": SCORE_SIGNATURE}


def positional_arity(fn) -> Optional[Tuple[int, float]]:
    """(fewest, most) positional arguments ``fn`` accepts; most is inf with ``*args``. Handles plain
    functions, lambdas, functools.partial and callable objects; None when Python cannot tell (some builtins),
    so that callers never reject what they cannot inspect."""
    if isinstance(fn, MaskMod):
        return 4, 4
    if isinstance(fn, ScoreMod):
        return 5, 5
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    fewest, most = 0, 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            most += 1
            fewest += p.default is p.empty
        elif p.kind is p.VAR_POSITIONAL:
            most = math.inf
    return fewest, most


def mod_role(fn) -> Optional[str]:
    """'mask_mod' or 'score_mod' by signature: a function taking 4 positional arguments is a mask_mod,
    one taking 5 a score_mod (FlexAttention's signatures). None when the signature fits both or neither
    (``*args``) or cannot be inspected."""
    arity = positional_arity(fn)
    if arity is None:
        return None
    fewest, most = arity
    fits = [role for role, n in _ROLE_ARGS.items() if fewest <= n <= most]
    if len(fits) == 1:
        return fits[0]
    if len(fits) == 2 and fewest == 4:  # def f(b, h, q_idx, kv_idx, extra=0): its required arguments decide
        return "mask_mod"
    return None


def _arity_text(fewest, most) -> str:
    if most == math.inf:
        return f"{fewest} or more positional arguments"
    count = f"{fewest}" if fewest == most else f"{fewest} to {most}"
    return f"{count} positional argument{'' if most == 1 else 's'}"


def _describe(fn) -> str:
    name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{name!r}"


def check_mod_signature(fn, role: str) -> None:
    """Raise ModSignatureError when ``fn`` cannot be called as ``role`` ('mask_mod' or 'score_mod') with
    FlexAttention's positional arguments; naming the fix when it fits the other role (swapped mods)."""
    if isinstance(fn, (MaskMod, ScoreMod)):
        given = "mask_mod" if isinstance(fn, MaskMod) else "score_mod"
        if given != role:
            raise ModSignatureError(
                f"{_describe(fn)} is a {type(fn).__name__}, {_ROLE_SIGNATURE[given]}, but it was passed as {role}, "
                f"which is called as {_ROLE_SIGNATURE[role]}. Fix: pass it as {given}=... "
                f"(attngen.compile({given}=...) or attngen.Variant({given}=...))"
            )
        return
    arity = positional_arity(fn)
    if arity is None:
        return
    fewest, most = arity
    n = _ROLE_ARGS[role]
    if fewest <= n <= most:
        return
    other = "score_mod" if role == "mask_mod" else "mask_mod"
    msg = (f"{_describe(fn)} was passed as {role}, which is called as {_ROLE_SIGNATURE[role]} ({n} positional "
           f"arguments), but it takes {_arity_text(fewest, most)}.")
    if fewest <= _ROLE_ARGS[other] <= most:
        msg += (f" It looks like a {other}, {_ROLE_SIGNATURE[other]}. Fix: pass it as {other}=... "
                f"(attngen.compile({other}=...) or attngen.Variant({other}=...))")
    else:
        msg += f" Fix: give it the signature {_ROLE_SIGNATURE[role]}"
    raise ModSignatureError(msg)


def _name_text(name, show_values: bool) -> str:
    """A mod's name: a string, or a function of whether runtime parameters show their values (params.py)."""
    return name if isinstance(name, str) else name(show_values)


class MaskMod:
    """A named mask_mod(b, h, q_idx, kv_idx) -> bool. Combine with ``&``, ``|``, ``~``."""

    def __init__(self, fn: Callable, name: Union[None, str, Callable[[bool], str]] = None):
        check_mod_signature(fn, "mask_mod")
        self.fn = fn
        self._name = name or getattr(fn, "__name__", "mask")

    name = property(lambda self: _name_text(self._name, True), doc="readable name, runtime parameters by value")
    key_name = property(lambda self: _name_text(self._name, False),
                        doc="the name with runtime parameters by name (what fingerprints and kernel names use)")

    def __call__(self, b, h, q_idx, kv_idx):
        return self.fn(b, h, q_idx, kv_idx)

    def __and__(self, other):
        other = as_mask_mod(other)
        return MaskMod(lambda b, h, q, k: self(b, h, q, k) & other(b, h, q, k),
                       lambda v: f"({_name_text(self._name, v)} & {_name_text(other._name, v)})")

    def __or__(self, other):
        other = as_mask_mod(other)
        return MaskMod(lambda b, h, q, k: self(b, h, q, k) | other(b, h, q, k),
                       lambda v: f"({_name_text(self._name, v)} | {_name_text(other._name, v)})")

    __rand__ = lambda self, other: as_mask_mod(other) & self  # noqa: E731
    __ror__ = lambda self, other: as_mask_mod(other) | self  # noqa: E731

    def __invert__(self):
        return MaskMod(lambda b, h, q, k: ~self(b, h, q, k), lambda v: f"~{_name_text(self._name, v)}")

    def __repr__(self):
        return f"MaskMod({self.name})"


class ScoreMod:
    """A named score_mod(score, b, h, q_idx, kv_idx) -> score. ``a.then(b)`` applies a, then b."""

    def __init__(self, fn: Callable, name: Union[None, str, Callable[[bool], str]] = None):
        check_mod_signature(fn, "score_mod")
        self.fn = fn
        self._name = name or getattr(fn, "__name__", "score")

    name = MaskMod.name
    key_name = MaskMod.key_name

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.fn(score, b, h, q_idx, kv_idx)

    def then(self, other):
        other = as_score_mod(other)
        return ScoreMod(lambda s, b, h, q, k: other(self(s, b, h, q, k), b, h, q, k),
                        lambda v: f"{_name_text(self._name, v)}>{_name_text(other._name, v)}")

    def __repr__(self):
        return f"ScoreMod({self.name})"


def compose(*score_mods) -> Optional[ScoreMod]:
    """compose(a, b, c) applies a, then b, then c. None entries are skipped."""
    mods = [as_score_mod(m) for m in score_mods if m is not None]
    if not mods:
        return None
    out = mods[0]
    for m in mods[1:]:
        out = out.then(m)
    return out


def as_mask_mod(fn) -> MaskMod:
    if isinstance(fn, MaskMod):
        return fn
    if not callable(fn):
        raise TypeError(f"expected a mask_mod(b, h, q_idx, kv_idx) callable, got {type(fn).__name__}")
    check_mod_signature(fn, "mask_mod")
    return MaskMod(with_math_shim(fn), getattr(fn, "__name__", "mask"))


def as_score_mod(fn) -> ScoreMod:
    if isinstance(fn, ScoreMod):
        return fn
    if not callable(fn):
        raise TypeError(f"expected a score_mod(score, b, h, q_idx, kv_idx) callable, got {type(fn).__name__}")
    check_mod_signature(fn, "score_mod")
    return ScoreMod(with_math_shim(fn), getattr(fn, "__name__", "score"))


@dataclass(frozen=True)
class Variant:
    """An attention variant: an optional score_mod and an optional mask_mod."""

    score_mod: Optional[ScoreMod] = None
    mask_mod: Optional[MaskMod] = None

    def __post_init__(self):
        # plain functions are accepted and wrapped (named, math.* shimmed)
        if self.score_mod is not None and not isinstance(self.score_mod, ScoreMod):
            object.__setattr__(self, "score_mod", as_score_mod(self.score_mod))
        if self.mask_mod is not None and not isinstance(self.mask_mod, MaskMod):
            object.__setattr__(self, "mask_mod", as_mask_mod(self.mask_mod))

    @property
    def name(self) -> str:
        parts = [m.name for m in (self.score_mod, self.mask_mod) if m is not None]
        return "+".join(parts) if parts else "full"

    @property
    def key_name(self) -> str:
        """The name with runtime parameters by name, not value: one kernel serves every value."""
        parts = [m.key_name for m in (self.score_mod, self.mask_mod) if m is not None]
        return "+".join(parts) if parts else "full"


def as_variant(obj) -> Variant:
    """Accept a Variant, a compiled attention object, a MaskMod or a ScoreMod (or None: full attention), or a
    plain function, by signature: 4 positional parameters make a mask_mod, 5 a score_mod."""
    if obj is None:
        return Variant()
    if isinstance(obj, Variant):
        return obj
    v = getattr(obj, "variant", None)
    if isinstance(v, Variant):
        return v
    if isinstance(obj, MaskMod):
        return Variant(mask_mod=obj)
    if isinstance(obj, ScoreMod):
        return Variant(score_mod=obj)
    if callable(obj) and not isinstance(obj, type):
        role = mod_role(obj)
        if role is not None:
            return Variant(**{role: obj})
        arity = positional_arity(obj)
        takes = "" if arity is None else f" (it takes {_arity_text(*arity)})"
        raise ModSignatureError(
            f"cannot tell from its signature whether {_describe(obj)} is a {MASK_SIGNATURE} (4 parameters) or a "
            f"{SCORE_SIGNATURE} (5 parameters){takes}; wrap it: attngen.MaskMod(fn) or attngen.ScoreMod(fn), "
            "or attngen.Variant(score_mod=..., mask_mod=...)"
        )
    raise TypeError(
        f"expected a variant (attngen.Variant, attngen.compile(...), a MaskMod or a ScoreMod), got {type(obj).__name__}; "
        "wrap plain functions with attngen.Variant(score_mod=fn, mask_mod=fn) or attngen.compile(score_mod=fn, mask_mod=fn)"
    )
