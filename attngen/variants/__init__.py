"""Library of attention variants, written once as FlexAttention-style mods.

Masks (``MaskMod``; combine with ``&``, ``|``, ``~``): causal, sliding_window, local, prefix_lm, chunked,
document, block_diagonal, dilated. Score mods (``ScoreMod``; chain with ``.then`` /
``attngen.mods.compose``): softcap, alibi. See docs/cookbook.md.
"""
from .masks import (
    VariantArgumentError,
    block_diagonal,
    causal,
    chunked,
    dilated,
    document,
    local,
    prefix_lm,
    sliding_window,
)
from .scores import alibi, softcap

__all__ = [
    "VariantArgumentError",
    "alibi",
    "block_diagonal",
    "causal",
    "chunked",
    "dilated",
    "document",
    "local",
    "prefix_lm",
    "sliding_window",
    "softcap",
]
