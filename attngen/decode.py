"""Launch stage of the KV-cache kernel (templates/fwd_decode.cuh, the second unit of every forward library: see
jit.render.DECODE_SOURCE): load its entry points, choose how many CTAs share a sequence's kv range
(Flash-Decoding's split count), launch it on torch tensors.

The forward library exports, besides attngen_fwd and its info, attngen_abi_version and attngen_error_string::

    int attngen_decode_kernel_info(AttngenKernelInfo*);
    int attngen_decode_heads_per_cta(int group);    // query heads of one kv head per CTA for this variant
    int attngen_decode(const AttngenDecodeArgs*, void* stream);   // the attention, then the combine kernel

``decode`` takes checked inputs (attngen/kvcache.py checks them and appends the new keys first) and launches
on the current torch stream of q's device, with no device sync: a decode step can be captured in a CUDA graph.
"""
from __future__ import annotations

import ctypes
import math
import struct
from typing import Optional, Sequence

import torch

from .launch import (_NO_PARAMS, _PACK_TAIL, _ZERO_TAIL, AttngenKernelInfo, CapturedArgs, _Library, _capable_devices,
                     _captured_fields, _check_capability, check_debug_record, debug_record,
                     call_on, launch_failed, load_family_library)

DECODE_ABI_VERSION = 2  # ATTNGEN_DECODE_ABI_VERSION (templates/attngen_decode_abi.cuh)


class AttngenDecodeArgs(ctypes.Structure):
    """ctypes mirror of the C struct (tests check its offsets against the header's); the launch packs the same
    fields, in this order, with one struct.pack."""

    _fields_ = ([(n, ctypes.c_void_p) for n in ("q", "k_cache", "v_cache", "o", "lse", "o_partial", "lse_partial",
                                                "seqlens", "cache_batch_idx", "page_table")]
                + [(n, ctypes.c_longlong * 3) for n in ("q_stride", "k_stride", "v_stride", "o_stride")]
                + [("page_table_stride", ctypes.c_longlong)]
                + [(n, ctypes.c_int) for n in ("B", "Hq", "Hkv", "Lq", "D", "seqlen_default", "kv_extra", "page_size",
                                               "num_splits", "heads_per_cta", "capacity", "num_pages", "cache_rows")]
                + [("scale", ctypes.c_float), ("captured", CapturedArgs)])


# Everything before `captured`: 10 pointers, 4x3 int64 strides, the page-table row stride, 13 int32, scale.
_PACK_DECODE_HEAD = struct.Struct("<10Q12qq13if")
assert _PACK_DECODE_HEAD.size == AttngenDecodeArgs.captured.offset == 240
assert _PACK_DECODE_HEAD.size + _PACK_TAIL.size == ctypes.sizeof(AttngenDecodeArgs) == 752
_HEAD_FIELDS = [(name, getattr(t, "_length_", 0)) for name, t in AttngenDecodeArgs._fields_[:-1]]  # (name, array length)


def pack_head(fields: dict) -> bytes:
    """The bytes of AttngenDecodeArgs before `captured`, from {field name: value} (strides as 3-sequences)."""
    flat = []
    for name, n in _HEAD_FIELDS:
        flat.extend(fields[name][:n] if n else (fields[name],))
    return _PACK_DECODE_HEAD.pack(*flat)


MAX_SPLITS = 128  # FA3's cap on Flash-Decoding splits
CTA_COST_TILES = 2  # a decode CTA's fixed cost in kv tiles (first tile's latency, epilogue): an estimate


class DecodeLibrary(_Library):
    """A loaded KV-cache library and what it was built for (block_q: packed query rows per CTA, heads x positions;
    block_k: cache positions per tile)."""

    def __init__(self, path: str, handle: ctypes.CDLL, info: AttngenKernelInfo):
        super().__init__(path, handle, info)
        self._decode = handle.attngen_decode
        self._decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        self._decode.restype = ctypes.c_int
        self._heads_fn = handle.attngen_decode_heads_per_cta
        self._heads_fn.argtypes = [ctypes.c_int]
        self._heads_fn.restype = ctypes.c_int
        self._heads = {}

    def heads_per_cta(self, group: int) -> int:
        """Query heads of one kv head a CTA walks together for a GQA group of ``group`` heads (1 when the variant's
        kv walk depends on the head)."""
        n = self._heads.get(group)
        if n is None:
            n = self._heads[group] = int(self._heads_fn(group))
        return n


def load_decode_library(path) -> DecodeLibrary:
    """Load a compiled KV-cache library and check that it speaks this ABI."""
    return load_family_library(path, DecodeLibrary, "KV-cache", "decode", DECODE_ABI_VERSION,
                               _PACK_DECODE_HEAD.size + _PACK_TAIL.size)


def num_splits_heuristic(ctas: int, slots: int, kv_tiles: int, max_splits: int = MAX_SPLITS) -> int:
    """FA3's rule for when not to split: one split when the CTAs already fill 80% of the GPU's CTA slots or a
    sequence has at most 4 kv tiles. Else the count with the shortest critical path: the waves of CTAs times a
    CTA's time, one split's kv tiles (ceil(kv_tiles / s)) plus CTA_COST_TILES for its first tile's latency and its
    epilogue; the fewest splits among equals. FA3 takes the smallest count within 85% of the best wave efficiency,
    which misses that tiles divide unevenly: one sequence of 2048 tiles over 8 kv heads on 264 slots runs 63 tiles
    per CTA with 33 splits, 64 with the 32 that fill the most slots (docs/performance.md, decode). ``slots``: SMs
    times the CTAs of this kernel one SM holds."""
    if ctas <= 0 or ctas >= 0.8 * slots or kv_tiles <= 4:
        return 1
    top = max(1, min(max_splits, kv_tiles))
    return min(range(1, top + 1),
               key=lambda s: (math.ceil(ctas * s / slots) * (math.ceil(kv_tiles / s) + CTA_COST_TILES), s))


_slots_cache: dict = {}


def cta_slots(lib: DecodeLibrary, dev: int) -> int:
    """SMs times the CTAs of ``lib`` one SM holds (by shared memory: the kernel's limit)."""
    key = (lib.smem_bytes, dev)
    n = _slots_cache.get(key)
    if n is None:
        props = torch.cuda.get_device_properties(dev)
        per_sm = getattr(props, "shared_memory_per_multiprocessor", 0) or 233472
        n = _slots_cache[key] = props.multi_processor_count * max(1, per_sm // (lib.smem_bytes + 1024))
    return n


def decode(lib: DecodeLibrary, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *,
           seqlens: Optional[torch.Tensor], seqlen_default: int, kv_extra: int, page_table: Optional[torch.Tensor],
           cache_batch_idx: Optional[torch.Tensor], num_splits: int, scale: float, return_lse: bool,
           captured: Sequence[torch.Tensor] = (), params: Optional[tuple] = None):
    """Attention of q (B, Hq, Lq, D) against the cache (layouts: attngen/kvcache.py) with checked inputs: sequence
    b has ``seqlens[b]`` (or ``seqlen_default``) cached positions before its queries and ``kv_extra`` after.
    ``num_splits`` 0 picks the count (``num_splits_heuristic``). Returns out (B, Hq, Lq, D) (and lse (B, Hq, Lq)
    float32)."""
    dev = q.get_device()
    if dev not in _capable_devices:
        _check_capability(dev)
    B, Hq, Lq, D = q.shape
    Hkv = k_cache.shape[1]
    paged = page_table is not None
    page_size = k_cache.shape[2] if paged else 0
    capacity = page_table.shape[1] * page_size if paged else k_cache.shape[2]
    heads = lib.heads_per_cta(Hq // Hkv)
    if num_splits == 0:
        longest = capacity if seqlens is not None else min(seqlen_default + kv_extra, capacity)
        ctas = B * (Hq // heads) * -(-Lq // (lib.block_q // heads))  # a CTA: 16 rows of heads x positions
        num_splits = num_splits_heuristic(ctas, cta_slots(lib, dev), -(-longest // lib.block_k))
    num_splits = max(1, min(num_splits, 65535))
    out = q.new_empty((B, Hq, Lq, D))
    lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=q.device) if return_lse else None
    if B * Hq * Lq == 0:
        return (out, lse) if return_lse else out
    o_part = lse_part = None
    if num_splits > 1:
        o_part = torch.empty((num_splits, B, Hq, Lq, D), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((num_splits, B, Hq, Lq), dtype=torch.float32, device=q.device)

    def ptr(t):
        return t.data_ptr() if t is not None else 0

    head = pack_head(dict(
        q=q.data_ptr(), k_cache=k_cache.data_ptr(), v_cache=v_cache.data_ptr(), o=out.data_ptr(), lse=ptr(lse),
        o_partial=ptr(o_part), lse_partial=ptr(lse_part), seqlens=ptr(seqlens), cache_batch_idx=ptr(cache_batch_idx),
        page_table=ptr(page_table), q_stride=q.stride(), k_stride=k_cache.stride(), v_stride=v_cache.stride(),
        o_stride=out.stride(), page_table_stride=page_table.stride(0) if paged else 0, B=B, Hq=Hq, Hkv=Hkv, Lq=Lq,
        D=D, seqlen_default=seqlen_default, kv_extra=kv_extra, page_size=page_size, num_splits=num_splits,
        heads_per_cta=heads, capacity=capacity, num_pages=k_cache.shape[0] if paged else 0,
        cache_rows=0 if paged else k_cache.shape[0], scale=float(scale)))
    record = None
    if lib.debug_slot is not None and captured and len(captured) == lib.debug_slot \
            and not torch.cuda.is_current_stream_capturing():  # the record is a host copy and a sync
        record = debug_record(captured, q.device)  # a debug build checks every captured-tensor read
    tail = (_PACK_TAIL.pack(*_captured_fields(q.device, list(captured) + ([record] if record is not None else []),
                                              (), params or _NO_PARAMS))
            if captured or params else _ZERO_TAIL)
    rc = call_on(dev, lib._decode, head + tail)
    if rc != 0:
        raise launch_failed(lib, "KV-cache attention kernel", rc,
                            f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, {q.dtype}, on {q.device}, "
                            f"{num_splits} splits")
    if record is not None:
        check_debug_record(record, captured)
    return (out, lse) if return_lse else out
