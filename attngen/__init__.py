"""attngen: compile attention variants (FlexAttention-style mods) into fast CUDA kernels.

    attn = attngen.compile(score_mod=attngen.softcap(30), window=4096)
    out = attn(q, k, v)
"""
import sys
import types

from . import reference
from .abi import __version__
from .errors import AttngenError, BuildError, CacheError, InputError, UnsupportedOperation
from .frontend import CompiledAttention, compile, make_variant
from .mods import MaskMod, ScoreMod, Variant, compose
from .variants import (
    VariantArgumentError,
    alibi,
    block_diagonal,
    causal,
    chunked,
    dilated,
    document,
    local,
    prefix_lm,
    sliding_window,
    softcap,
)

__all__ = [
    "compile", "CompiledAttention", "block_map", "explain", "analyze", "trace", "derive", "make_variant",
    "reference", "MaskMod", "ScoreMod", "Variant", "compose",
    "AttngenError", "BuildError", "CacheError", "InputError", "UnsupportedOperation", "VariantArgumentError",
    "alibi", "block_diagonal", "causal", "chunked", "dilated", "document", "local", "prefix_lm",
    "sliding_window", "softcap",
]

# The sympy stages load on first use (PEP 562), so `import attngen` and a compile served from the analysis
# records on disk never import sympy.
_LAZY = {"analyze": "analysis", "block_map": "blockmap", "explain": "blockmap", "trace": "trace",
         "derive": "predicates"}
# submodules `import attngen` used to load, still reachable as attributes (attngen.predicates.derive)
_LAZY_SUBMODULES = ("analysis", "blockmap", "codegen", "predicates", "printer", "symbols")


def __getattr__(name):
    from importlib import import_module

    if name in _LAZY_SUBMODULES:
        return import_module(f".{name}", __name__)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'attngen' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_SUBMODULES))


class _Package(types.ModuleType):
    """attngen's module type: `attngen.trace` stays the trace function when the submodule of that name is
    imported later (the import system then sets the package attribute to the submodule)."""

    def __setattr__(self, name, value):
        if name == "trace" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
