"""Runtime parameters: numbers a mod reads that reach the kernel as arguments, so one build serves every value.

``param("window", 1024, minimum=1)`` makes a ``RuntimeParam``. A mod uses it like the number it holds
(``q_idx - kv_idx < window``, ``cap * torch.tanh(score / cap)``): on tensors (the reference path, brute force)
it is its current value; while the mod is traced it is a sympy symbol with the parameter's assumptions
(integer >= 0 or >= 1, or a positive real), so the derived block predicates are symbolic in it and the kernel
reads it from ``CapturedArgs`` (``c.iparam[slot]`` / ``c.fparam[slot]``). Its value is never part of a cache key
or fingerprint; its name, kind and lower bound are. ``specialize=True`` bakes the value in instead: the trace
sees a plain constant, as it does for a Python number a user's mod closes over.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import operator
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from .errors import AttngenError

# The kernels add int parameters to positions and tile bounds in int32 (q_idx + window, ...): below 2**30 no
# such sum overflows for any sequence int32 positions can index, and codegen's +-infinity (2**30) stays beyond.
INT_PARAM_MAX = 2**30 - 1


class _ThreadState(threading.local):
    """What a RuntimeParam reads in this thread: a trace or a pinned backward in one thread must not change what
    the same parameter computes in another."""

    def __init__(self):
        # readers installed by the tracer while it runs (symbolic_reader): RuntimeParam -> its symbolic proxy
        self.symbolic_readers: List[Callable] = []
        # id(RuntimeParam) -> the value it reads instead of its current one (pinned_values); replaced, never mutated
        self.pinned: Dict[int, object] = {}


_THREAD = _ThreadState()


class ParamValueError(AttngenError, ValueError, TypeError):
    """A runtime parameter was given a value the kernels cannot take (see RuntimeParam.check)."""


class RuntimeParam:
    """A named number a mod reads: a kernel argument (default) or, with ``specialize=True``, a baked constant.

    ``integer``: an int parameter (>= ``minimum``, which is 0 or 1); otherwise a positive finite float.
    ``set(value)`` changes the value of a runtime parameter: every compiled object holding it runs the new value
    on its next call, on the same kernel.
    """

    __slots__ = ("name", "integer", "minimum", "specialized", "_value")

    def __init__(self, name: str, value, *, integer: bool, minimum: Optional[int] = None, specialize: bool = False):
        if integer and minimum not in (None, 0, 1):
            raise ValueError("an integer RuntimeParam's minimum is None, 0 or 1 (what sympy's assumptions can carry)")
        self.name = name
        self.integer = bool(integer)
        self.minimum = minimum if integer else None
        self.specialized = bool(specialize)
        self._value = self.check(value)

    @property
    def value(self):
        """The current value, or the one pinned in this thread (pinned_values: a backward recomputing its forward)."""
        pinned = _THREAD.pinned
        return pinned.get(id(self), self._value) if pinned else self._value

    def set(self, value) -> None:
        """Change the value; raises ParamValueError for a specialised parameter or a value it cannot take."""
        if self.specialized:
            raise ParamValueError(
                f"parameter {self.name!r} was specialised (baked into the kernel as {self._value}); build the variant "
                f"again with the new value, or create it without specialize=True to change it at run time"
            )
        self._value = self.check(value)

    def check(self, value):
        """``value`` as this parameter's Python type, or a ParamValueError naming the problem and the fix."""
        if self.integer:
            try:
                if isinstance(value, bool):
                    raise TypeError
                v = operator.index(value)
            except TypeError:
                hint = (f" (it is an integer parameter because it was made from an int; for a real-valued one make "
                        f"it from a float, e.g. attngen.param({self.name!r}, 30.0))" if isinstance(value, numbers.Real)
                        and not isinstance(value, bool) else "")
                raise ParamValueError(
                    f"parameter {self.name!r} must be an int, got {value!r} ({type(value).__name__}); pass e.g. "
                    f"{max(self.minimum or 0, 1) * 1024}{hint}"
                ) from None
            lo = -INT_PARAM_MAX if self.minimum is None else self.minimum
            if not lo <= v <= INT_PARAM_MAX:
                raise ParamValueError(
                    f"parameter {self.name!r} must be in [{lo}, {INT_PARAM_MAX}] (the kernels add it to positions in "
                    f"int32), got {v}; pass a value in that range (a bound beyond every position, e.g. a window "
                    "longer than the sequence, acts as no bound)"
                )
            return int(v)
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ParamValueError(
                f"parameter {self.name!r} must be a positive number, got {value!r} ({type(value).__name__}); "
                "pass e.g. 30.0"
            )
        v = float(value)
        # the kernels read it as float32: a value that rounds to 0 or inf there would divide by zero
        if not (v > 0.0 and math.isfinite(v) and 1.2e-38 <= v <= 3.4e38):
            raise ParamValueError(
                f"parameter {self.name!r} must be a finite number > 0 that float32 represents (1.2e-38 .. 3.4e38), "
                f"got {value!r}; pass e.g. 30.0"
            )
        return v

    def operand(self):
        """What the mod computes with: the symbolic proxy while traced (unless specialised), else the value."""
        readers = _THREAD.symbolic_readers
        if readers and not self.specialized:
            return readers[-1](self)
        return self.value

    def __repr__(self):
        kind = "int" if self.integer else "float"
        return f"RuntimeParam({self.name!r}, {self._value!r}, {kind}{', specialized' if self.specialized else ''})"

    # a mod uses the parameter as the number it stands for
    __add__ = lambda s, o: s.operand() + o  # noqa: E731
    __radd__ = lambda s, o: o + s.operand()  # noqa: E731
    __sub__ = lambda s, o: s.operand() - o  # noqa: E731
    __rsub__ = lambda s, o: o - s.operand()  # noqa: E731
    __mul__ = lambda s, o: s.operand() * o  # noqa: E731
    __rmul__ = lambda s, o: o * s.operand()  # noqa: E731
    __truediv__ = lambda s, o: s.operand() / o  # noqa: E731
    __rtruediv__ = lambda s, o: o / s.operand()  # noqa: E731
    __floordiv__ = lambda s, o: s.operand() // o  # noqa: E731
    __rfloordiv__ = lambda s, o: o // s.operand()  # noqa: E731
    __mod__ = lambda s, o: s.operand() % o  # noqa: E731
    __rmod__ = lambda s, o: o % s.operand()  # noqa: E731
    __pow__ = lambda s, o: s.operand() ** o  # noqa: E731
    __rpow__ = lambda s, o: o ** s.operand()  # noqa: E731
    __neg__ = lambda s: -s.operand()  # noqa: E731
    __pos__ = lambda s: +s.operand()  # noqa: E731
    __abs__ = lambda s: abs(s.operand())  # noqa: E731
    __lt__ = lambda s, o: s.operand() < o  # noqa: E731
    __le__ = lambda s, o: s.operand() <= o  # noqa: E731
    __gt__ = lambda s, o: s.operand() > o  # noqa: E731
    __ge__ = lambda s, o: s.operand() >= o  # noqa: E731
    # == and != compare the number too (two parameters: the same parameter); hashing stays by identity
    __eq__ = lambda s, o: s is o if isinstance(o, RuntimeParam) else s.operand() == o  # noqa: E731
    __ne__ = lambda s, o: s is not o if isinstance(o, RuntimeParam) else s.operand() != o  # noqa: E731
    __hash__ = object.__hash__
    __bool__ = lambda s: bool(s.operand())  # noqa: E731
    __index__ = lambda s: operator.index(s.operand())  # noqa: E731
    __int__ = lambda s: int(s.operand())  # noqa: E731
    __float__ = lambda s: float(s.operand())  # noqa: E731

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # torch ops with a parameter among the arguments (score / cap on a tensor): run them on its operand
        def sub(x):
            if isinstance(x, RuntimeParam):
                return x.operand()
            if isinstance(x, (tuple, list)):
                return type(x)(sub(y) for y in x)
            return x

        return func(*sub(tuple(args)), **{k: sub(v) for k, v in (kwargs or {}).items()})


def param(name: str, value, *, minimum: Optional[int] = None, specialize: bool = False) -> RuntimeParam:
    """A runtime parameter for a user's mod: an int ``value`` makes an integer parameter (``minimum`` None, 0
    or 1: the bound the block predicates may assume), a float a positive real one. See RuntimeParam."""
    integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return RuntimeParam(name, value, integer=integer, minimum=minimum, specialize=specialize)


@contextlib.contextmanager
def symbolic_reader(reader: Callable) -> Iterator[None]:
    """Within the block, in this thread only, runtime parameters read as ``reader(param)`` (the tracer's proxies)."""
    readers = _THREAD.symbolic_readers
    readers.append(reader)
    try:
        yield
    finally:
        readers.pop()


@contextlib.contextmanager
def pinned_values(params: Sequence[RuntimeParam], values: Sequence) -> Iterator[None]:
    """Within the block, in this thread only, each of ``params`` reads the matching entry of ``values`` (mods and
    kernel arguments alike), whatever ``set()`` does meanwhile: an autograd backward recomputes its forward with
    the values that forward ran, not the current ones. Blocks nest; other threads keep the current values."""
    if len(params) != len(values):
        raise ValueError(f"pinned_values got {len(params)} parameters but {len(values)} values; pass one per parameter")
    outer = _THREAD.pinned
    inner = dict(outer)
    for p, v in zip(params, values):
        inner[id(p)] = p.check(v)
    # a new dict rather than an update: the caller's view is restored exactly, also when the block raises
    _THREAD.pinned = inner
    try:
        yield
    finally:
        _THREAD.pinned = outer
