"""``attngen.compile``: declare a variant, get a callable that runs it.

The heavy stages run once per variant object and are memoised here: tracing (trace.py), predicate
derivation (predicates.py); the kernel is built lazily on the first CUDA call (kernels.py) and cached
on disk per signature.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional, Tuple, Union

import torch

from .build import SM90_FALLBACK_CODES
from .errors import InputError
from .ir import BlockPredicates, TracedVariant
from .mods import ScoreMod, Variant, as_mask_mod, as_score_mod, as_variant, compose
from .predicates import derive
from .reference import _check_offset
from .runtime import KernelLaunchError, forward
from .trace import trace

_ANALYSIS: "OrderedDict[tuple, tuple]" = OrderedDict()
_ANALYSIS_SIZE = 64  # bounded: entries hold the mods (and their captured tensors) alive
_LOCK = threading.Lock()


def analyze(variant) -> Tuple[TracedVariant, BlockPredicates]:
    """Trace and derive once per variant (memoised on compiled objects, and in a small LRU keyed by
    the mod objects, which the entry keeps alive so their ids cannot be reused while cached)."""
    if isinstance(variant, CompiledAttention) and hasattr(variant, "predicates"):
        return variant.traced, variant.predicates
    v = as_variant(variant)
    key = (id(v.score_mod), id(v.mask_mod))
    with _LOCK:
        hit = _ANALYSIS.get(key)
        if hit is not None and hit[0] is v.score_mod and hit[1] is v.mask_mod:
            _ANALYSIS.move_to_end(key)
            return hit[2], hit[3]
    traced = trace(v)
    preds = derive(traced)
    with _LOCK:
        _ANALYSIS[key] = (v.score_mod, v.mask_mod, traced, preds)
        while len(_ANALYSIS) > _ANALYSIS_SIZE:
            _ANALYSIS.popitem(last=False)
    return traced, preds


def _mask_from_options(mask_mod, causal: bool, window):
    from .variants import causal as causal_mask, local, sliding_window

    parts = []
    if window is not None:
        if isinstance(window, (tuple, list)):
            if len(window) != 2:
                raise InputError(f"window must be an int (sliding window) or a (left, right) pair, got {window!r}")
            parts.append(local(window[0], window[1]))
            if causal:
                parts.append(causal_mask())
        else:
            parts.append(sliding_window(window))  # already causal
    elif causal:
        parts.append(causal_mask())
    if mask_mod is not None:
        parts.insert(0, as_mask_mod(mask_mod))
    if not parts:
        return None
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out


def make_variant(score_mod=None, mask_mod=None, *, causal: bool = False, window=None, softcap=None) -> Variant:
    from .variants import softcap as softcap_mod

    score = compose(softcap_mod(softcap) if softcap is not None else None, score_mod)
    return Variant(score_mod=score, mask_mod=_mask_from_options(mask_mod, causal, window))


class CompiledAttention:
    """A compiled variant. Call it like ``attn(q, k, v)`` with (B, H, L, D) tensors.

    CUDA tensors run the generated kernel (built on first use per dtype/head dim, then cached on
    disk); CPU tensors run ``attngen.reference.attention``.
    """

    def __init__(self, variant: Variant, backend: str = "auto", fast_math: bool = True):
        if backend not in ("auto", "sm90", "sm80", "reference"):
            raise InputError(f"backend must be one of 'auto', 'sm90', 'sm80', 'reference', got {backend!r}")
        self.variant = variant
        self.backend = backend
        self.fast_math = fast_math
        self.traced, self.predicates = analyze(variant)
        self._kernels = {}
        # (dtype, head dim, device index) -> the library this object launches by default, filled by
        # kernels._library for variants that read no captured tensors: the call's hot path
        self._ready = {}

    @property
    def name(self) -> str:
        return self.variant.name

    def __repr__(self):
        return f"attngen.compile({self.variant.name}, backend={self.backend!r})"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: Optional[float] = None,
                 return_lse: bool = False, q_offset: int = 0):
        # Hot path: a library already loaded for this dtype, head dim and device; forward() checks the
        # rest. Anything unusual (not a tensor, CPU tensors, a first call) takes the full path below.
        try:
            lib = self._ready.get((q.dtype, q.shape[-1], q.get_device()))
        except (AttributeError, IndexError, TypeError):
            lib = None
        if lib is not None and q_offset.__class__ is int and q_offset >= 0:
            try:
                return forward(lib, q, k, v, scale=scale, q_offset=q_offset, return_lse=return_lse)
            except KernelLaunchError as e:
                if e.code not in SM90_FALLBACK_CODES:
                    raise
                # the layout cannot be described by a TMA tensor map: the portable kernel, as run_forward does
                from .kernels import run_forward

                return run_forward(self, q, k, v, scale=scale, return_lse=return_lse, q_offset=q_offset,
                                   kernel="sm80")
        if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
            raise InputError("q, k, v must be torch tensors of shape (B, H, L, D)")
        if q_offset.__class__ is not int or q_offset < 0:
            q_offset = _check_offset(q_offset)
        if self.backend == "reference" or not q.is_cuda:
            from . import reference

            return reference.attention(q, k, v, self.variant, scale=scale, return_lse=return_lse, q_offset=q_offset)
        from .kernels import run_forward

        return run_forward(self, q, k, v, scale=scale, return_lse=return_lse, q_offset=q_offset)

    def block_map(self, q_len: int, kv_len: Optional[int] = None, block=(128, 128), **kw):
        from .blockmap import block_map

        return block_map(self, q_len, q_len if kv_len is None else kv_len, block, **kw)

    def explain(self, q_len: int = 32768, kv_len: Optional[int] = None, **kw) -> str:
        from .blockmap import explain

        return explain(self, q_len, kv_len, **kw)


def compile(score_mod=None, mask_mod=None, *, causal: bool = False, window: Union[None, int, Tuple] = None,
            softcap: Optional[float] = None, backend: str = "auto", fast_math: bool = True) -> CompiledAttention:
    """Compile an attention variant.

    Args:
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score`` (FlexAttention signature), or a
            library ScoreMod (``attngen.softcap(30)``, ``attngen.alibi(16)``).
        mask_mod: ``mask_mod(b, h, q_idx, kv_idx) -> bool``, or a library MaskMod; combined with the
            options below by ``&``.
        causal: add a causal mask.
        window: ``int`` W for a causal sliding window (kv in (q-W, q]); ``(left, right)`` for a local
            window (kv in [q-left, q+right], FA3 semantics; None on a side means unbounded).
        softcap: ``c`` applies ``c * tanh(score / c)`` before ``score_mod``.
        backend: 'auto' (SM90 kernel on Hopper when available, else the portable SM80 kernel),
            'sm80', 'sm90', or 'reference' (the chunked PyTorch implementation).
        fast_math: use the approximate tanh/exp2 instructions in score mods.

    Example:
        >>> attn = attngen.compile(score_mod=attngen.softcap(30), window=4096)
        >>> out = attn(q, k, v)
    """
    return CompiledAttention(make_variant(score_mod, mask_mod, causal=causal, window=window, softcap=softcap),
                             backend=backend, fast_math=fast_math)
