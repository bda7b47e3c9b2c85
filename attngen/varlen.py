"""``attn.varlen``: packed variable-length sequences (flash_attn_varlen_func's layout).

  q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv)
  cu_seqlens_q, cu_seqlens_k: int32 (B + 1,), 0 first, non-decreasing, last = total_q / total_k

Sequence b holds query rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 and key rows cu_seqlens_k[b] ..
cu_seqlens_k[b+1] - 1, of which only the first ``seqused_k[b]`` are attended when seqused_k is given (the rest
of its slot is padding). Writing n_q and n_k for the query count and the attended key count of sequence b, the
variant sees b = the sequence number, h = the query head, kv_idx = 0 .. n_k - 1 (local to the sequence) and
q_idx = i + max(n_k - n_q, 0) for its query i: the queries are aligned to the END of the keys (flash-attn's
bottom-right alignment, so causal and windows mean "the last n_q positions of the sequence", as in chunked
prefill), and to the start when there are more queries than keys (attngen's positions are never negative).

CUDA tensors on a kernel backend run the forward kernel once per sequence, on views of the packed tensors (a
batch of one whose q_offset is the sequence's, so its block skipping is the sequence's own); CPU tensors and
``backend='reference'`` run the reference. One launch for all sequences is issue 12's varlen kernel, still to
come: until then the lengths are read on the host (no CUDA-graph capture) and a variant that reads ``b`` (the
sequence number here) runs only on the reference, since a batch of one would show it b = 0.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .errors import InputError
from .reference import _check_scale, compute_dtype
from .sequences import (GpuPathNotAvailable, attend_sequence, check_bool, check_index_tensor, check_nonnegative_int,
                        check_sequence_extents)


def varlen(attn, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: Optional[int] = None,
           max_seqlen_k: Optional[int] = None, seqused_k=None, scale=None, return_lse: bool = False):
    """See the module docstring and ``CompiledAttention.varlen``. Returns out (total_q, Hq, Dv) and with
    ``return_lse`` also lse (Hq, total_q) (flash-attn's varlen LSE layout), float32 (float64 for float64)."""
    if not isinstance(q, torch.Tensor):
        raise InputError(f"q must be a torch.Tensor (total_q, Hq, D), got {type(q).__name__}")
    kernel = q.device.type == "cuda" and attn.backend != "reference"
    if kernel:
        _check_kernel_path(attn)
    Hq, D, Dv = _check_packed(q, k, v)
    starts_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], q.device)
    starts_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], q.device)
    if len(starts_q) != len(starts_k):
        raise InputError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, got "
                         f"{len(starts_q) - 1} and {len(starts_k) - 1} (shapes ({len(starts_q)},) and ({len(starts_k)},))")
    B = len(starts_q) - 1
    n_q = [starts_q[b + 1] - starts_q[b] for b in range(B)]
    n_k = _used_k(seqused_k, [starts_k[b + 1] - starts_k[b] for b in range(B)], q.device)
    _check_max("max_seqlen_q", max_seqlen_q, n_q)
    _check_max("max_seqlen_k", max_seqlen_k, n_k)
    check_bool("return_lse", return_lse)
    scale = _check_scale(scale, D)

    offsets = [max(n_k[b] - n_q[b], 0) for b in range(B)]  # queries aligned to the end of the keys
    for b in range(B):
        check_sequence_extents(attn, B, Hq, n_q[b], n_k[b], offsets[b])

    compute = compute_dtype(q.dtype)
    out = q.new_empty((q.shape[0], Hq, Dv))
    lse = torch.empty((Hq, q.shape[0]), dtype=compute, device=q.device)
    for b in range(B):
        rows = slice(starts_q[b], starts_q[b + 1])
        keys = slice(starts_k[b], starts_k[b] + n_k[b])
        qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q[rows], k[keys], v[keys]))  # (1, H, n, D) views
        if not kernel:
            ob, lb = attend_sequence(attn, qb, kb, vb, b, offsets[b], scale)
        elif n_q[b] == 0:
            continue
        elif n_k[b] == 0:  # nothing to attend: the reference's zeros and -inf
            ob, lb = qb.new_zeros(qb.shape[:3] + (Dv,)), lse.new_full((1, Hq, n_q[b]), float("-inf"))
        else:
            with torch.no_grad():  # inference only, as the reference path
                ob, lb = attn(qb, kb, vb, scale=scale, q_offset=offsets[b], return_lse=True)
        out[rows] = ob[0].transpose(0, 1)
        lse[:, rows] = lb[0]
    return (out, lse) if return_lse else out


def _check_kernel_path(attn) -> None:
    """What the per-sequence kernel path cannot do yet (issue 12's varlen kernel will): graph capture, and
    variants that read b (a batch of one would show them b = 0)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise InputError("attn.varlen reads cu_seqlens on the host (one forward launch per sequence until the varlen "
                         "kernel lands), so it cannot be captured in a CUDA graph; capture attn(q, k, v, q_offset=...) "
                         "per sequence instead, or run varlen outside the graph")
    if attn.facts.reads_b:
        raise GpuPathNotAvailable(
            f"attn.varlen runs the forward kernel once per sequence, as a batch of one, so a variant that reads b "
            f"({attn.name} does) would see b = 0 for every sequence. Fix: compile it with backend='reference' (slow, "
            "exact), or make the mod index by position instead of b")


def _check_packed(q, k, v):
    """Ranks, dtypes, devices and head counts of the packed tensors; returns (Hq, D, Dv)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise InputError(f"{name} must be 3-D packed (total_{'q' if name == 'q' else 'k'}, heads, head_dim), got "
                             f"shape {tuple(t.shape)}; concatenate the sequences along dim 0 (flash-attn's varlen layout)")
        if not t.dtype.is_floating_point:
            raise InputError(f"{name} must be floating point (float16, bfloat16, float32, float64), got {t.dtype}")
        if t.dtype == torch.float8_e4m3fn:
            raise InputError("varlen does not take FP8 (float8_e4m3fn) inputs: call attn(q, k, v, q_descale=...) per "
                             "sequence, or pass bfloat16")
        if t.dtype != q.dtype or t.device != q.device:
            raise InputError(f"q, k, v must share one dtype and device, got q {q.dtype} on {q.device}, {name} "
                             f"{t.dtype} on {t.device}; convert with .to(q)")
    _, Hq, D = q.shape
    total_k, Hkv, Dk = k.shape
    if v.shape[:2] != k.shape[:2]:
        raise InputError(f"k and v must agree in total_k and heads, got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if Dk != D:
        raise InputError(f"k head dim {Dk} differs from q's {D}; they must match")
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"query heads must be a multiple of kv heads (GQA/MQA), got Hq={Hq}, Hkv={Hkv}")
    return Hq, D, v.shape[2]


def _cu_seqlens(name: str, t, total: int, device) -> List[int]:
    """The cumulative offsets as ints: 0 first, non-decreasing, ``total`` last."""
    check_index_tensor(name, t, 1, device, "(B + 1,) cumulative sequence starts")
    starts = t.tolist()
    if not starts:
        raise InputError(f"{name} must have B + 1 >= 1 entries (0, then each sequence's end), got an empty tensor")
    if starts[0] != 0:
        raise InputError(f"{name}[0] must be 0 (the first sequence starts at row 0), got {starts[0]}")
    for b in range(len(starts) - 1):
        if starts[b + 1] < starts[b]:
            raise InputError(f"{name} must be non-decreasing, but {name}[{b + 1}] = {starts[b + 1]} < "
                             f"{name}[{b}] = {starts[b]}; entry b + 1 is where sequence b ends")
    if starts[-1] != total:
        raise InputError(f"{name}[-1] = {starts[-1]} but the packed tensor has {total} rows; the last entry must be "
                         "the total length (drop unused rows, or end the last sequence there)")
    return starts


def _used_k(seqused_k, lengths: List[int], device) -> List[int]:
    """The attended key count of each sequence: seqused_k[b] (at most its slot's length), or the whole slot."""
    if seqused_k is None:
        return lengths
    check_index_tensor("seqused_k", seqused_k, 1, device, "(B,) keys attended in each sequence")
    if seqused_k.shape[0] != len(lengths):
        raise InputError(f"seqused_k must have one entry per sequence, ({len(lengths)},), got {tuple(seqused_k.shape)}")
    used = seqused_k.tolist()
    for b, (u, n) in enumerate(zip(used, lengths)):
        if not 0 <= u <= n:
            raise InputError(f"seqused_k[{b}] = {u} but sequence {b} has {n} key rows (from cu_seqlens_k); it must be "
                             f"in [0, {n}]")
    return used


def _check_max(name: str, value, lengths: List[int]) -> None:
    """max_seqlen_* are upper bounds the kernels size their grids by; a smaller one would drop rows."""
    if value is None:
        return
    check_nonnegative_int(name, value, "the longest sequence")
    longest = max(lengths, default=0)
    if value < longest:
        raise InputError(f"{name} = {value} but a sequence has {longest} rows; pass at least the longest length "
                         "(or None to compute it)")
