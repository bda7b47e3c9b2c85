"""Library mask mods: causal, windows, prefix-LM, chunks, documents, blocks, dilation.

Every function returns a ``MaskMod`` around a plain ``mask_mod(b, h, q_idx, kv_idx)``. The body is
evaluated both on broadcast torch tensors (reference path) and on the tracer's symbolic proxies, so it
uses only Python operators, comparisons and ``& | ~`` (never ``and``/``or``/``not``/``if`` on index
values) and indexes captured tensors with index expressions. Constants are validated here, once, so a
bad argument fails at construction with a message that names the fix, not deep inside a kernel build.

Numbers (window sizes, chunk and prefix lengths, local bounds, dilation) are runtime parameters
(attngen/params.py) by default: kernel arguments, so one build serves every value, and the block predicates
are derived symbolically in them. ``specialize=True`` bakes the value into the kernel instead.

``q_idx`` is the ABSOLUTE query position (row + q_offset); ``kv_idx`` is the key position.
"""
from __future__ import annotations

import numbers
import operator
from typing import Optional

import torch

from ..errors import AttngenError
from ..mods import MaskMod
from ..params import RuntimeParam


class VariantArgumentError(AttngenError, ValueError, TypeError):
    """A library variant (``attngen.variants.*``) was given an argument it cannot use.

    Subclasses both ValueError and TypeError: callers may catch either, whichever the mistake was.
    """


def _as_int(fn: str, name: str, value, minimum: int, example: str) -> int:
    """``value`` as a Python int >= minimum, or a VariantArgumentError naming the call to write instead."""
    if isinstance(value, bool) or value is None:
        ok = False
    else:
        try:
            value = operator.index(value)
            ok = True
        except TypeError:
            ok = False
    if not ok:
        raise VariantArgumentError(
            f"{fn}(): {name} must be an int >= {minimum}, got {value!r} ({type(value).__name__}); "
            f"write e.g. {example}"
        )
    if value < minimum:
        raise VariantArgumentError(
            f"{fn}(): {name} must be >= {minimum}, got {value}; write e.g. {example}"
        )
    return int(value)


def _as_opt_int(fn: str, name: str, value, minimum: int, example: str) -> Optional[int]:
    return None if value is None else _as_int(fn, name, value, minimum, example)


def _int_param(fn: str, name: str, value, minimum: int, example: str, specialize: bool) -> RuntimeParam:
    """A validated int argument as a runtime parameter (a kernel argument unless ``specialize``)."""
    return RuntimeParam(name, _as_int(fn, name, value, minimum, example), integer=True, minimum=minimum,
                        specialize=specialize)


def _shown(p: Optional[RuntimeParam], show_values: bool) -> str:
    """A parameter in a mod's name: its value, or (in key names) its name when the kernel takes it as an argument."""
    if p is None:
        return "None"
    return _fmt(p.value) if show_values or p.specialized else p.name


def causal() -> MaskMod:
    """Causal: query q sees keys kv <= q (absolute positions)."""

    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    return MaskMod(causal_mask, "causal")


def sliding_window(window: int, *, specialize: bool = False) -> MaskMod:
    """Causal sliding window of ``window`` keys: kv in (q - window, q]. ``window=1`` keeps only the diagonal.
    ``window`` is a kernel argument (one build serves every window) unless ``specialize=True``."""
    w = _int_param("sliding_window", "window", window, 1, "sliding_window(1024)", specialize)

    def sliding_window_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < w)

    return MaskMod(sliding_window_mask, lambda v: f"sliding_window({_shown(w, v)})")


def local(left: Optional[int], right: Optional[int], *, specialize: bool = False) -> MaskMod:
    """FlashAttention-3 style local window: kv in [q - left, q + right] (both ends included).

    ``None`` leaves that side unbounded, so ``local(None, 0)`` is causal and ``local(w - 1, 0)`` equals
    ``sliding_window(w)``. The bounds are kernel arguments unless ``specialize=True``; None is part of the build.
    """
    lo = _as_opt_int("local", "left", left, 0, "local(128, 0) or local(None, 0) for an unbounded left side")
    hi = _as_opt_int("local", "right", right, 0, "local(128, 0) or local(128, None) for an unbounded right side")
    lo_p = None if lo is None else RuntimeParam("left", lo, integer=True, minimum=0, specialize=specialize)
    hi_p = None if hi is None else RuntimeParam("right", hi, integer=True, minimum=0, specialize=specialize)
    if lo is None and hi is None:
        raise VariantArgumentError(
            "local(None, None) masks nothing; pass mask_mod=None for full attention, or give a bound, "
            "e.g. local(None, 0) for causal"
        )
    if hi is None:
        def local_mask(b, h, q_idx, kv_idx):
            return q_idx - kv_idx <= lo_p
    elif lo is None:
        def local_mask(b, h, q_idx, kv_idx):
            return kv_idx - q_idx <= hi_p
    else:
        def local_mask(b, h, q_idx, kv_idx):
            return (q_idx - kv_idx <= lo_p) & (kv_idx - q_idx <= hi_p)

    return MaskMod(local_mask, lambda v: f"local({_shown(lo_p, v)}, {_shown(hi_p, v)})")


def prefix_lm(prefix: int, *, specialize: bool = False) -> MaskMod:
    """Prefix-LM: every query sees the first ``prefix`` keys (bidirectional prefix), the rest causally.
    ``prefix`` is a kernel argument unless ``specialize=True``."""
    n = _int_param("prefix_lm", "prefix", prefix, 0, "prefix_lm(2048)", specialize)

    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < n) | (q_idx >= kv_idx)

    return MaskMod(prefix_lm_mask, lambda v: f"prefix_lm({_shown(n, v)})")


def chunked(size: int, *, specialize: bool = False) -> MaskMod:
    """Llama-4 chunked causal attention: causal inside consecutive chunks of ``size`` positions.
    ``size`` is a kernel argument unless ``specialize=True``."""
    c = _int_param("chunked", "size", size, 1, "chunked(8192)", specialize)

    def chunked_mask(b, h, q_idx, kv_idx):
        return (q_idx // c == kv_idx // c) & (q_idx >= kv_idx)

    return MaskMod(chunked_mask, lambda v: f"chunked({_shown(c, v)})")


def block_diagonal(size: int, *, specialize: bool = False) -> MaskMod:
    """Bidirectional attention inside consecutive blocks of ``size`` positions (q // size == kv // size).
    ``size`` is a kernel argument unless ``specialize=True``."""
    s = _int_param("block_diagonal", "size", size, 1, "block_diagonal(256)", specialize)

    def block_diagonal_mask(b, h, q_idx, kv_idx):
        return q_idx // s == kv_idx // s

    return MaskMod(block_diagonal_mask, lambda v: f"block_diagonal({_shown(s, v)})")


def dilated(window: int, dilation: int, *, specialize: bool = False) -> MaskMod:
    """Causal window of ``window`` positions that keeps only every ``dilation``-th key:
    kv in (q - window, q] with (q - kv) % dilation == 0. ``dilated(w, 1)`` equals ``sliding_window(w)``.
    ``window`` is a kernel argument unless ``specialize=True``; ``dilation`` is always part of the build (a
    constant lets the kernel compare q and kv residues; as an argument it costs an integer modulo per element,
    measured 4.9x slower: docs/performance.md)."""
    w = _int_param("dilated", "window", window, 1, "dilated(1024, 4)", specialize)
    d = _int_param("dilated", "dilation", dilation, 1, "dilated(1024, 4)", True)

    def dilated_mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < w) & ((q_idx - kv_idx) % d == 0)

    return MaskMod(dilated_mask, lambda v: f"dilated({_shown(w, v)}, {_shown(d, v)})")


def document(doc_ids: torch.Tensor) -> MaskMod:
    """Document (packed-sequence) masking: q and kv attend only within one document.

    ``doc_ids`` is an integer tensor of document ids per position: shape (S,) shared by the whole batch,
    or (B, S) per batch row (then ``doc_ids[b, q_idx]``). It is captured by reference: the kernel reads
    the live tensor at every call, so it must be on the inputs' device and cover every absolute
    position (S >= max(q_offset + q_len, kv_len)). Combine with ``causal()`` for causal packing:
    ``causal() & document(doc_ids)``. The mask bans cross-document pairs only; sorting ids is not required.
    """
    if not isinstance(doc_ids, torch.Tensor):
        raise VariantArgumentError(
            f"document(): doc_ids must be a torch.Tensor of document ids, got {type(doc_ids).__name__}; "
            "write e.g. document(torch.tensor(ids, dtype=torch.int32, device='cuda'))"
        )
    if doc_ids.dtype.is_floating_point or doc_ids.dtype.is_complex or doc_ids.dtype == torch.bool:
        raise VariantArgumentError(
            f"document(): doc_ids must have an integer dtype (int32 or int64), got {doc_ids.dtype}; "
            "convert it with doc_ids.to(torch.int32)"
        )
    if doc_ids.dim() not in (1, 2):
        raise VariantArgumentError(
            f"document(): doc_ids must be 1-D (seq_len,) or 2-D (batch, seq_len), got shape "
            f"{tuple(doc_ids.shape)}; for a shared layout pass doc_ids[0] (1-D), per batch row pass (B, S)"
        )
    if doc_ids.numel() == 0:
        raise VariantArgumentError(
            f"document(): doc_ids is empty (shape {tuple(doc_ids.shape)}); it needs one id per position"
        )
    ids = doc_ids

    if ids.dim() == 1:
        def document_mask(b, h, q_idx, kv_idx):
            return ids[q_idx] == ids[kv_idx]

        name = f"document({ids.shape[0]})"
    else:
        def document_mask(b, h, q_idx, kv_idx):
            return ids[b, q_idx] == ids[b, kv_idx]

        name = f"document({ids.shape[0]}x{ids.shape[1]})"

    return MaskMod(document_mask, name)


def _real(fn: str, name: str, value, example: str) -> float:
    """``value`` as a finite float > 0 (shared with scores.py)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise VariantArgumentError(
            f"{fn}(): {name} must be a positive number, got {value!r} ({type(value).__name__}); write e.g. {example}"
        )
    v = float(value)
    if not (v > 0.0 and v != float("inf")):
        raise VariantArgumentError(f"{fn}(): {name} must be a finite number > 0, got {value!r}; write e.g. {example}")
    return v


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))
