"""Fingerprint of a variant's mods, computed without tracing (sympy-free), like Triton's JIT cache key.

The trace of a mod is a function of its code, the values its code can reach (closure cells, the globals and
module attributes it names, defaults) and the metadata of the tensors among them (dtype, shape, strides,
device type: a traced kernel reads tensor values at call time, never at trace time). ``fingerprint(variant)``
walks exactly that and hashes it together with everything else the analysis depends on (attngen's version
and analysis sources, torch, sympy and Python versions). Two variants with equal fingerprints trace to the
same ``TracedVariant`` up to the live tensors, so the analysis can be looked up on disk by fingerprint
(analysis_cache.py).

Anything the walk cannot describe by value (an arbitrary object, a user class, a bound method of unknown
type, a function of a module outside the allow-list) gives no fingerprint (None): that variant is traced
every time, never looked up. ``ValueReadWatch`` covers the one gap a walk cannot see: a mod that reads a
tensor's values while being traced (``.item()``, ``int(t[0])``); a trace during which that happened must not
be recorded.
"""
from __future__ import annotations

import builtins
import hashlib
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

from .abi import __version__
from .mods import _MATH_MODULE_SHIM, MaskMod, ScoreMod, Variant
from .params import RuntimeParam

# Bumped when what the walk describes changes, so old records become unreachable instead of misread.
_DOMAIN = "attngen-analysis-fingerprint/2"
# The analysis stages a record's content depends on (plus this module's own walk and the record format).
_ANALYSIS_SOURCES = ("trace.py", "predicates.py", "summaries.py", "mods.py", "params.py", "symbols.py", "codegen.py",
                     "printer.py", "ir.py", "fingerprint.py", "analysis.py", "analysis_cache.py", "abi.py")
# Modules whose functions, types and submodules are described by name: their behaviour is fixed by the
# versions in the digest (torch) or by the interpreter (math, builtins, operator).
_LIBRARY_MODULES = ("torch", "math", "builtins", "operator", "_operator")


class _Undescribable(Exception):
    """A value the walk cannot describe by value: the variant gets no fingerprint."""


@dataclass(frozen=True)
class Fingerprint:
    """``digest`` keys the analysis record; ``tensors`` are the tensors the walk met, in walk order (a
    record names captured tensors by their position here, so a hit can bind the live objects); ``params``
    likewise the runtime parameters (params.py), described by name and kind, never by value."""

    digest: str
    tensors: Tuple[torch.Tensor, ...]
    params: Tuple[RuntimeParam, ...] = ()


def _in_library(module_name: Optional[str]) -> bool:
    return bool(module_name) and module_name.split(".")[0] in _LIBRARY_MODULES


def _code_names(code: types.CodeType) -> frozenset:
    """Global and attribute names a code object and the code nested in it can look up."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return frozenset(names)


class _Walk:
    def __init__(self):
        self.tensors: List[torch.Tensor] = []
        self._tensor_pos = {}  # id -> position in self.tensors
        self.params: List[RuntimeParam] = []
        self._param_pos = {}  # id -> position in self.params
        self._seen = {}        # id of a function / mod / module -> its index in walk order (cycles, sharing)
        self._keep = []        # objects whose ids are in the tables above, kept alive during the walk
        self._modules_open = set()  # ids of the user modules being described (cycles)

    def _first_visit(self, obj):
        """None the first time ``obj`` is seen, else a back-reference to it."""
        k = id(obj)
        if k in self._seen:
            return ("ref", self._seen[k])
        self._seen[k] = len(self._seen)
        self._keep.append(obj)
        return None

    def describe(self, obj, names: frozenset = frozenset()):
        """A nested tuple of plain values standing for ``obj``; ``names`` are the attribute names the code
        being walked can look up (used to describe the attributes of a user module it reads)."""
        if obj is None or isinstance(obj, (bool, int, str, bytes)):
            return (type(obj).__name__, obj)
        if isinstance(obj, float):
            return ("float", obj.hex())
        if isinstance(obj, complex):
            return ("complex", obj.real.hex(), obj.imag.hex())
        if obj is Ellipsis:
            return ("ellipsis",)
        if isinstance(obj, slice):
            return ("slice", self.describe(obj.start), self.describe(obj.stop), self.describe(obj.step))
        if isinstance(obj, (tuple, list)) and type(obj) in (tuple, list, torch.Size):
            return (type(obj).__name__, tuple(self.describe(x, names) for x in obj))
        if type(obj) in (set, frozenset):
            return ("set", tuple(sorted(repr(self.describe(x, names)) for x in obj)))
        if type(obj) is dict:
            return ("dict", tuple(sorted((repr(self.describe(k)), self.describe(v, names)) for k, v in obj.items())))
        if type(obj) in (torch.Tensor, torch.nn.Parameter):
            return self._tensor(obj)
        if isinstance(obj, (torch.dtype, torch.device, torch.layout)):
            return (type(obj).__name__, str(obj))
        if isinstance(obj, types.CodeType):
            return self._code(obj)
        if obj is _MATH_MODULE_SHIM:
            return ("math-shim",)  # built from math and mods.py, both covered by the digest
        if type(obj) is RuntimeParam:
            return self._param(obj)
        if type(obj) in (MaskMod, ScoreMod):
            # the name too: it appears in what the trace records (a captured tensor's source mod); runtime
            # parameters appear in it by name (key_name), so every value of one shares the record
            return self._first_visit(obj) or (type(obj).__name__, self.describe(obj.key_name), self.describe(obj.fn))
        if type(obj) is Variant:
            return ("Variant", self.describe(obj.score_mod), self.describe(obj.mask_mod))
        if isinstance(obj, types.FunctionType):
            if _in_library(obj.__module__) and not obj.__closure__:
                return ("library-function", obj.__module__, obj.__qualname__)
            # a library closure (torch's and_masks(...)) holds the caller's functions: walked like user code
            return self._first_visit(obj) or self._function(obj)
        if isinstance(obj, types.MethodType) and type(obj.__self__) in (MaskMod, ScoreMod):
            return ("method", obj.__func__.__qualname__, self.describe(obj.__self__))
        if isinstance(obj, types.BuiltinFunctionType):
            owner = obj.__self__
            if (owner is None or isinstance(owner, types.ModuleType)) and _in_library(obj.__module__ or getattr(owner, "__name__", None)):
                return ("builtin", obj.__module__ or owner.__name__, obj.__qualname__)
            raise _Undescribable(obj)
        if isinstance(obj, (types.MethodDescriptorType, types.WrapperDescriptorType, types.ClassMethodDescriptorType)):
            if _in_library(getattr(obj.__objclass__, "__module__", None)):
                return ("descriptor", obj.__objclass__.__module__, obj.__qualname__)
            raise _Undescribable(obj)
        if isinstance(obj, type):
            if _in_library(obj.__module__):
                return ("type", obj.__module__, obj.__qualname__)
            raise _Undescribable(obj)
        if isinstance(obj, types.ModuleType):
            return self._module(obj, names)
        raise _Undescribable(obj)

    def _tensor(self, t: torch.Tensor):
        pos = self._tensor_pos.get(id(t))
        if pos is not None:
            return ("tensor-ref", pos)  # one object reached twice is one captured tensor, not two
        if t.layout != torch.strided:
            raise _Undescribable(t)
        pos = self._tensor_pos[id(t)] = len(self.tensors)
        self.tensors.append(t)
        return ("tensor", pos, str(t.dtype), tuple(t.shape), tuple(t.stride()), t.device.type)

    def _param(self, p: RuntimeParam):
        kind = (p.name, p.integer, p.minimum)
        if p.specialized:
            return ("param-specialized", kind, self.describe(p.value))  # baked into the kernel: its value counts
        pos = self._param_pos.get(id(p))
        if pos is None:
            pos = self._param_pos[id(p)] = len(self.params)
            self.params.append(p)
        return ("param", pos, kind)

    def _code(self, code: types.CodeType):
        return ("code", code.co_code, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                code.co_flags, code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                getattr(code, "co_exceptiontable", b""), tuple(self.describe(c) for c in code.co_consts))

    def _function(self, fn: types.FunctionType):
        code = fn.__code__
        names = _code_names(code)
        closure = []
        for cell in fn.__closure__ or ():
            try:
                closure.append(self.describe(cell.cell_contents, names))
            except ValueError:  # an empty cell (a variable assigned after the function was made)
                closure.append(("empty-cell",))
        g = fn.__globals__
        reached = []
        for n in sorted(names):
            if n in g:
                reached.append((n, self.describe(g[n], names)))
            elif hasattr(builtins, n):
                reached.append((n, self.describe(getattr(builtins, n), names)))
        # attributes set on the function object (fn.window = 3) can be read by its body
        attrs = self.describe(dict(fn.__dict__), names) if fn.__dict__ else None
        return ("function", self._code(code), self.describe(fn.__defaults__), self.describe(fn.__kwdefaults__),
                tuple(closure), tuple(reached), attrs)

    def _module(self, mod: types.ModuleType, names: frozenset):
        if _in_library(mod.__name__):
            return ("module", mod.__name__)
        # a user module: the values of the attributes the code can read (config.WINDOW) are part of the trace.
        # Described again for every function that reaches it, with that function's names (a back-reference
        # would keep only the first function's); a module reached from its own attributes is a cycle.
        if id(mod) in self._modules_open:
            return ("module-cycle", mod.__name__)
        self._modules_open.add(id(mod))
        try:
            attrs = tuple((n, self.describe(getattr(mod, n), names)) for n in sorted(names) if hasattr(mod, n))
        finally:
            self._modules_open.discard(id(mod))
        return ("module", mod.__name__, attrs)


_ENVIRONMENT: Optional[str] = None


def _environment() -> str:
    """Digest of everything besides the mods that the analysis depends on (computed once per process)."""
    global _ENVIRONMENT
    if _ENVIRONMENT is None:
        h = hashlib.sha256()
        pkg = Path(__file__).resolve().parent
        for name in _ANALYSIS_SOURCES:
            h.update(name.encode() + b"\0")
            try:
                h.update(hashlib.sha256((pkg / name).read_bytes()).digest())
            except OSError:
                h.update(b"missing")
        try:
            from importlib.metadata import version

            sympy_version = version("sympy")
        except Exception:  # no metadata: the sources and torch still key it; sympy's absence is recorded
            sympy_version = "unknown"
        for part in (_DOMAIN, __version__, torch.__version__, sympy_version, sys.version,
                     sys.implementation.cache_tag):
            h.update(str(part).encode() + b"\0")
        _ENVIRONMENT = h.hexdigest()
    return _ENVIRONMENT


def fingerprint(variant) -> Optional[Fingerprint]:
    """The fingerprint of a Variant's mods, or None when the walk meets something it cannot describe."""
    walk = _Walk()
    try:
        desc = walk.describe(variant)
    except (_Undescribable, RecursionError):
        return None
    h = hashlib.sha256()
    h.update(_environment().encode())
    h.update(repr(desc).encode())
    return Fingerprint(h.hexdigest(), tuple(walk.tensors), tuple(walk.params))


# ----------------------------------------------------------------------------------------------------------
# value reads during a trace

# Tensor metadata a mod may read while traced: all of it is in the fingerprint (dtype, shape, strides, device).
_METADATA_ATTRIBUTES = frozenset({"shape", "dtype", "ndim", "device", "is_cuda", "layout"})
_METADATA_METHODS = frozenset({"dim", "size", "stride", "numel", "nelement", "ndimension", "__len__",
                               "is_floating_point", "is_contiguous", "element_size", "get_device"})


def _has_symbolic(x) -> bool:
    if getattr(type(x), "_attngen_symbolic", False):
        return True
    if isinstance(x, (tuple, list)):
        return any(_has_symbolic(y) for y in x)
    if isinstance(x, dict):
        return any(_has_symbolic(y) for y in x.values())
    return False


def _is_metadata(func) -> bool:
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", "") in _METADATA_ATTRIBUTES
    return name in _METADATA_METHODS


class ValueReadWatch(TorchFunctionMode):
    """Active during a trace: ``read`` names the first torch operation computed from real tensors alone
    (``t.max()``, ``t[0].item()``, ``torch.tensor(...)``), i.e. a value a fingerprint by metadata cannot
    see; None when the trace only indexed tensors with symbolic values and read their metadata."""

    def __init__(self):
        super().__init__()
        self.read: Optional[str] = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.read is None and not _is_metadata(func) and not (_has_symbolic(args) or _has_symbolic(kwargs)):
            self.read = getattr(func, "__qualname__", None) or repr(func)
        return func(*args, **kwargs)
