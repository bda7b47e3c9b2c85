"""attngen: compile attention variants (FlexAttention-style mods) into fast CUDA kernels.

    attn = attngen.compile(score_mod=attngen.softcap(30), window=4096)
    out = attn(q, k, v)
"""
from . import reference
from .abi import __version__
from .analysis import analyze
from .blockmap import block_map, explain
from .errors import AttngenError, BuildError, CacheError, InputError, UnsupportedOperation
from .frontend import CompiledAttention, compile, make_variant
from .mods import MaskMod, ScoreMod, Variant, compose
from .trace import trace
from .predicates import derive
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
