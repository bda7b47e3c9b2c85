"""Analysis: trace a variant and derive its block predicates, once per variant object.

Shared by ``attngen.compile`` (frontend) and the inspection tools (blockmap), so neither imports the other.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional, Tuple

from .fingerprint import ValueReadWatch
from .ir import BlockPredicates, TracedVariant
from .mods import as_variant
from .predicates import derive
from .trace import trace

_ANALYSIS: "OrderedDict[tuple, tuple]" = OrderedDict()
_ANALYSIS_SIZE = 64  # bounded: entries hold the mods (and their captured tensors) alive
_LOCK = threading.Lock()


def analyze(variant) -> Tuple[TracedVariant, BlockPredicates]:
    """(traced variant, block predicates) of a variant, a pair of mods, or a compiled object. Memoised on
    compiled objects, and in a small LRU keyed by the mod objects, which the entry keeps alive so their
    ids cannot be reused while cached."""
    traced, preds = getattr(variant, "traced", None), getattr(variant, "predicates", None)
    if isinstance(traced, TracedVariant) and isinstance(preds, BlockPredicates):
        return traced, preds
    traced, preds, _ = analyze_watched(as_variant(variant))
    return traced, preds


def analyze_watched(v) -> Tuple[TracedVariant, BlockPredicates, Optional[str]]:
    """``analyze`` of a Variant, plus the first torch operation its trace computed from real tensor values
    (fingerprint.ValueReadWatch; None when there was none), which decides whether the analysis may be
    recorded on disk by fingerprint."""
    key = (id(v.score_mod), id(v.mask_mod))
    with _LOCK:
        hit = _ANALYSIS.get(key)
        if hit is not None and hit[0] is v.score_mod and hit[1] is v.mask_mod:
            _ANALYSIS.move_to_end(key)
            return hit[2], hit[3], hit[4]
    with ValueReadWatch() as watch:
        traced = trace(v)
    preds = derive(traced)
    with _LOCK:
        _ANALYSIS[key] = (v.score_mod, v.mask_mod, traced, preds, watch.read)
        while len(_ANALYSIS) > _ANALYSIS_SIZE:
            _ANALYSIS.popitem(last=False)
    return traced, preds, watch.read
