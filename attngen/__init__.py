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
from .params import ParamValueError, RuntimeParam, param
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
    "reference", "MaskMod", "ScoreMod", "Variant", "compose", "param", "RuntimeParam", "ParamValueError",
    "AttngenError", "BuildError", "CacheError", "InputError", "UnsupportedOperation", "VariantArgumentError",
    "alibi", "block_diagonal", "causal", "chunked", "dilated", "document", "local", "prefix_lm",
    "sliding_window", "softcap", "flex_attention",
]

# The sympy stages load on first use (PEP 562), so `import attngen` and a compile served from the analysis
# records on disk never import sympy.
_LAZY = {"analyze": "analysis", "block_map": "blockmap", "explain": "blockmap", "trace": "trace",
         "derive": "predicates", "flex_attention": "integrations.flex"}
# submodules `import attngen` used to load, still reachable as attributes (attngen.predicates.derive)
_LAZY_SUBMODULES = ("analysis", "blockmap", "codegen", "integrations", "predicates", "printer", "symbols")


from ._lazy import lazy_attributes  # noqa: E402

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, _LAZY_SUBMODULES)


class _Package(types.ModuleType):
    """attngen's module type: `attngen.trace` stays the trace function when the submodule of that name is
    imported later (the import system then sets the package attribute to the submodule)."""

    def __setattr__(self, name, value):
        if name == "trace" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
