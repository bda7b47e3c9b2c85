"""Attention whose mask also reads a per-call tensor of segment ids (Hugging Face padding masks, packed rows).

``seg`` is (B, Lk) int32 over the key columns: -1 drops the key (padding), other values are segment ids. Two mask
forms are combined with a variant's own mask:

    "keys"      seg[b, kv_idx] >= 0                                              (key padding only)
    "segments"  (seg[b, kv_idx] >= 0) & (seg[b, q_idx] == seg[b, kv_idx])       (also: a query sees its own segment)

attngen binds a variant's captured tensors when it compiles it, and its custom ops read them from the variant,
not from the ops' inputs. So per-call values are copied into a buffer the variant captured. That copy cannot be
traced code: under torch.compile, functionalization moves a mutation of a captured tensor after the ops that read
it (they would read the previous call's values), and in training the next layer's copy would bump the version of
a tensor autograd saved. So the copy and the call happen inside one opaque custom op,
``attngen_integrations::segment_attention``; its backward, ``segment_attention_bwd``, reloads the buffer and runs
attngen's backward op (``attngen::attention_bwd``). The op saves the small ``seg`` tensor, never the buffer.

A buffer grows (a new buffer, the variant compiled again over it: a disk-cache hit, no tracing) when a call needs
more rows or columns than it has; it is filled only where a call reads it.

There is one buffer per (device, CUDA stream). The lock is released once a kernel is issued, not when it ends:
with one buffer per device, a call on another stream could overwrite the segment ids a kernel still reads (and
skip its own copy when the previous call passed the same tensor, then read a buffer whose copy has not landed on
its stream). Within a stream, copies and kernels run in issue order. Streams come from torch's per-device pool,
so their number (and the buffers') stays small.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import torch

from .. import reference
from ..autograd import param_values
from ..launch import _raw_stream
from ._cache import constant_result

_FORMS = ("keys", "segments")
_LOCK = threading.Lock()
_SEGMENTED: Dict[str, "_Segmented"] = {}


def _keys_mask(buf):
    def kept_key(b, h, q_idx, kv_idx):
        return buf[b, kv_idx] >= 0

    return kept_key


def _segments_mask(buf):
    def same_segment(b, h, q_idx, kv_idx):
        return (buf[b, kv_idx] >= 0) & (buf[b, q_idx] == buf[b, kv_idx])

    return same_segment


class _Segmented:
    """One variant (causal / window / softcap options and a mask form) over per-device segment buffers."""

    def __init__(self, causal, window, softcap, form):
        self.options = dict(causal=causal, window=window, softcap=softcap)
        self.form = form
        self.lock = threading.Lock()
        # (device, stream handle or None) -> [buffer, CompiledAttention, last source, its version]
        self.state: Dict[tuple, list] = {}

    def load(self, seg: torch.Tensor) -> Tuple[object, torch.Tensor]:
        """Copy ``seg`` into the buffer of its device and the current stream (growing it when too small); return
        (CompiledAttention, buffer). Call with ``self.lock`` held until the attention call has been issued."""
        from ..frontend import compile

        B, L = seg.shape
        where = stream_key(seg.device)
        st = self.state.get(where)
        if st is None or B > st[0].shape[0] or L > st[0].shape[1]:
            rows = max(B, st[0].shape[0] if st else 0)
            cols = max(L, 2 * st[0].shape[1] if st else 0, 256)
            # a normal tensor even under torch.inference_mode: a later call outside it copies into the buffer
            with torch.inference_mode(False):
                buf = torch.full((rows, cols), -1, dtype=torch.int32, device=seg.device)
            mask = (_keys_mask if self.form == "keys" else _segments_mask)(buf)
            st = self.state[where] = [buf, compile(mask_mod=mask, **self.options), None, -1]
        capturing = seg.is_cuda and torch.cuda.is_current_stream_capturing()
        # the same tensor, unchanged, as the last call (every layer of one forward): nothing to copy. The last
        # source is held, so its memory cannot come back as a new mask at the same address. A CUDA graph capture
        # always records the copy: a replay must not depend on what was loaded before the capture. An inference
        # tensor has no version counter (reading it raises): it is always copied, and not remembered.
        inference = seg.is_inference()
        if capturing or inference or st[2] is not seg or st[3] != seg._version:
            st[0][:B, :L].copy_(seg)
            st[2], st[3] = (None, -1) if inference else (seg, seg._version)
        return st[1], st[0]


def stream_key(device: torch.device) -> tuple:
    """Which segment buffer a call on ``device`` uses: one per CUDA stream (module doc), one for the CPU."""
    if device.type != "cuda":
        return device, None
    return device, _raw_stream(device.index)


@constant_result
def segmented_key(causal, window, softcap, form) -> str:
    """The registry key of a segmented variant (created on first use; dynamo calls this, it does not trace it)."""
    if form not in _FORMS:
        raise ValueError(f"form must be one of {_FORMS}, got {form!r}")
    key = f"{form}|causal={causal!r}|window={window!r}|softcap={softcap!r}"
    if key not in _SEGMENTED:
        with _LOCK:
            _SEGMENTED.setdefault(key, _Segmented(causal, window, softcap, form))
    return key


def segment_attention(q, k, v, seg, *, causal=False, window=None, softcap=None, form="segments", scale=None,
                      q_offset: int = 0):
    """Attention of the variant (causal / window / softcap) masked by ``seg`` in ``form`` (module doc).
    q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D), seg (B, Lk) integer; differentiable in q, k, v; traceable."""
    key = segmented_key(causal, window, softcap, form)
    scale = reference._check_scale(scale, q.shape[-1])
    out, _ = torch.ops.attngen_integrations.segment_attention(q, k, v, seg.to(torch.int32), key, float(scale),
                                                              int(q_offset))
    return out


# ----------------------------------------------------------------------------------------------------------
# the custom ops


@torch.library.custom_op("attngen_integrations::segment_attention", mutates_args=())
def _segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: torch.Tensor, key: str,
                       scale: float, q_offset: int) -> Tuple[torch.Tensor, torch.Tensor]:
    entry = _SEGMENTED[key]
    with entry.lock:
        attn, _ = entry.load(seg)
        with torch.no_grad():
            out, lse = attn(q, k, v, scale=scale, return_lse=True, q_offset=q_offset)
    return out.contiguous(), lse.contiguous()


@_segment_attention.register_fake
def _(q, k, v, seg, key, scale, q_offset):
    B, Hq, Lq, _ = q.shape
    return q.new_empty((B, Hq, Lq, v.shape[3])), q.new_empty((B, Hq, Lq), dtype=reference.compute_dtype(q.dtype))


@torch.library.custom_op("attngen_integrations::segment_attention_bwd", mutates_args=())
def _segment_attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, seg: torch.Tensor, key: str, scale: float,
                           q_offset: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    entry = _SEGMENTED[key]
    with entry.lock:
        attn, buf = entry.load(seg)
        # attngen's own backward op (the kernel on CUDA, the float32 recompute elsewhere); the buffer is its one
        # captured tensor and needs no gradient. The variant's parameters (window, cap) are private to this
        # module and never set(), so their current values are the forward's.
        dq, dk, dv, _ = torch.ops.attngen.attention_bwd(dout, None, q, k, v, out, lse, [buf], attn.op_id, scale,
                                                        q_offset, param_values(attn), [True, True, True, False])
    return dq, dk, dv


@_segment_attention_bwd.register_fake
def _(dout, q, k, v, out, lse, seg, key, scale, q_offset):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, seg, key, scale, q_offset = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, seg)
    ctx.key, ctx.scale, ctx.q_offset = key, scale, q_offset
    ctx.set_materialize_grads(False)


def _backward(ctx, dout, dlse):
    # the LSE is internal (segment_attention returns only the output): dlse is always None
    q, k, v, out, lse, seg = ctx.saved_tensors
    if dout is None:
        return None, None, None, None, None, None, None
    dq, dk, dv = torch.ops.attngen_integrations.segment_attention_bwd(dout, q, k, v, out, lse, seg, ctx.key,
                                                                      ctx.scale, ctx.q_offset)
    need = ctx.needs_input_grad
    return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None, None, None, None)


_segment_attention.register_autograd(_backward, setup_context=_setup_context)
