"""``attn.with_kvcache``: attention against a KV cache, appending new keys in place (flash_attn_with_kvcache).

This module fixes the semantics and is the reference implementation (CPU tensors, or ``backend='reference'``);
CUDA tensors run the decode kernel (attngen/decode.py), tested against it. Layouts follow attngen's (B, H, L, D):

  q        (B, Hq, Lq, D)          k, v (new keys, optional)   (B, Hkv, L_new, D) / (B, Hkv, L_new, Dv)
  contiguous cache  k_cache (B_cache, Hkv, L_max, D), v_cache (B_cache, Hkv, L_max, Dv)
  paged cache       k_cache (num_pages, Hkv, page_size, D), page_table int32 (B, max_pages)

Sequence b has ``s_b = cache_seqlens[b]`` cached keys before the call (positions 0 .. s_b - 1). The call

  1. checks every input (nothing is written when a check fails);
  2. rotates the new keys at positions s_b .. s_b + L_new - 1 (when rotary tables are given) and writes them
     and the new values into the cache at those positions: the only cache entries the call writes;
  3. attends: query i of batch b sits at absolute position s_b + i (rotated there too), keys are cache
     positions 0 .. s_b + L_new - 1; the variant sees b (q's batch index), h (query head), q_idx = s_b + i and
     kv_idx = cache position, so causal, windows, ALiBi, document and custom masks read absolute positions.

Position p of sequence b lives at ``k_cache[row_b, :, p]`` (row_b = cache_batch_idx[b], or b), or paged at
``k_cache[page_table[b, p // page_size], :, p % page_size]`` (a page at most once in the entries a sequence
uses). All appends happen before any attention, and a cache slot one sequence writes must not be read by another
in the same call (checked).
"""
from __future__ import annotations

import math
from typing import Callable, List, Tuple

import torch

from .errors import InputError
from .reference import _check_scale, compute_dtype
from .rotary import apply_rotary, check_rotary
from .sequences import (attend_sequence, check_bool, check_index_tensor, check_nonnegative_int,
                        check_sequence_extents)

MAX_PAGE_SIZE = 256  # the decode kernels gather pages of 1 to 256 keys (cp.async, or TMA on whole kv tiles)

# (batch index, positions (n,) int64) -> (first index, third index) of the cache entries holding them
Locate = Callable[[int, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def with_kvcache(attn, q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, page_table=None, rotary_cos=None,
                 rotary_sin=None, rotary_interleaved=False, cache_batch_idx=None, num_splits=0, return_lse=False,
                 scale=None):
    """See the module docstring and ``CompiledAttention.with_kvcache``."""
    if not isinstance(q, torch.Tensor):
        raise InputError(f"q must be a torch.Tensor (B, Hq, Lq, D), got {type(q).__name__}")
    if q.device.type == "cuda" and attn.backend != "reference":
        return _with_kvcache_kernel(attn, q, k_cache, v_cache, k, v, cache_seqlens, page_table, rotary_cos,
                                    rotary_sin, rotary_interleaved, cache_batch_idx, num_splits, return_lse, scale)
    B, Hq, Lq, D, Hkv, Dv, L_new = _check_tensors(q, k_cache, v_cache, k, v)
    paged = page_table is not None
    if paged:
        locate, capacity = _paged_layout(B, q.device, k_cache, page_table, cache_batch_idx)
    else:
        locate, capacity = _contiguous_layout(B, q.device, k_cache, cache_batch_idx)
    scale = _check_options(rotary_interleaved, num_splits, return_lse, scale, D)
    starts = _cache_seqlens(cache_seqlens, B, q.device, capacity, L_new)
    # before the appends: a failing call writes nothing
    _check_values(attn, q, k_cache, page_table, locate, starts, L_new, cache_batch_idx is not None, rotary_cos,
                  rotary_sin, q.device)

    def rotate(x, b, n):  # x (H, n, D): at positions s_b .. s_b + n - 1
        if rotary_cos is None:
            return x
        return apply_rotary(x, rotary_cos, rotary_sin, _positions(starts[b], n, q.device), rotary_interleaved)

    compute = compute_dtype(q.dtype)
    out = q.new_empty((B, Hq, Lq, Dv))
    lse = torch.empty((B, Hq, Lq), dtype=compute, device=q.device)
    # an inference entry point: the cache is written in place, so no autograd graph is recorded
    with torch.no_grad():
        for b in range(B):
            if L_new:
                major, minor = locate(b, _positions(starts[b], L_new, q.device))
                k_cache[major, :, minor] = rotate(k[b], b, L_new).transpose(0, 1)
                v_cache[major, :, minor] = v[b].transpose(0, 1)
        for b in range(B):
            major, minor = locate(b, _positions(0, starts[b] + L_new, q.device))
            kb = k_cache[major, :, minor].transpose(0, 1).unsqueeze(0)  # (1, Hkv, s_b + L_new, D)
            vb = v_cache[major, :, minor].transpose(0, 1).unsqueeze(0)
            ob, lb = attend_sequence(attn, rotate(q[b], b, Lq).unsqueeze(0), kb, vb, b, starts[b], scale)
            out[b], lse[b] = ob[0], lb[0]
    return (out, lse) if return_lse else out


def _positions(start: int, n: int, device) -> torch.Tensor:
    return torch.arange(start, start + n, device=device)


def _check_tensors(q, k_cache, v_cache, k, v):
    """Shapes, dtypes and devices of q, the caches and the new keys; returns (B, Hq, Lq, D, Hkv, Dv, L_new)."""
    if q.dim() != 4:
        raise InputError(f"q must be 4-D (B, Hq, Lq, D), got shape {tuple(q.shape)}; for (B, Lq, Hq, D) pass "
                         "q.transpose(1, 2)")
    if not q.dtype.is_floating_point:
        raise InputError(f"q must be floating point (float16, bfloat16, float32, float64), got {q.dtype}")
    if q.dtype == torch.float8_e4m3fn:
        raise InputError("with_kvcache does not take FP8 (float8_e4m3fn) inputs: the FP8 forward is attn(q, k, v, "
                         "q_descale=...) on whole tensors; pass a bfloat16 or float16 cache here")
    if (k is None) != (v is None):
        raise InputError("k and v (the keys and values to append) come together: pass both, or neither")
    named = [("k_cache", k_cache), ("v_cache", v_cache)] + ([("k", k), ("v", v)] if k is not None else [])
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(f"{name} must be 4-D, got shape {tuple(t.shape)}: caches are (B, Hkv, L_max, D) or "
                             "paged (num_pages, Hkv, page_size, D), new keys (B, Hkv, L_new, D)")
        if t.dtype != q.dtype:
            raise InputError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}; convert it with .to({q.dtype})")
        if t.device != q.device:
            raise InputError(f"{name} is on {t.device} but q is on {q.device}; move it with .to('{q.device}')")
    B, Hq, Lq, D = q.shape
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise InputError(f"k_cache and v_cache must agree in all but the last dim, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    Hkv, Dv = k_cache.shape[1], v_cache.shape[3]
    if k_cache.shape[3] != D:
        raise InputError(f"k_cache head dim {k_cache.shape[3]} differs from q's {D}; they must match")
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"query heads must be a multiple of the cache's kv heads (GQA/MQA), got Hq={Hq}, Hkv={Hkv}")
    L_new = 0
    if k is not None:
        L_new = k.shape[2]
        for name, t, d in (("k", k, D), ("v", v, Dv)):
            if tuple(t.shape) != (B, Hkv, L_new, d):
                raise InputError(f"{name} must have shape (B, Hkv, L_new, {'D' if name == 'k' else 'Dv'}) = "
                                 f"{(B, Hkv, L_new, d)} (from q and the caches), got {tuple(t.shape)}")
    return B, Hq, Lq, D, Hkv, Dv, L_new


def _contiguous_layout(B: int, device, k_cache, cache_batch_idx, values: bool = True):
    """(locate, capacity) of a contiguous cache; the index tensors must be on ``device``. ``values=False`` checks
    the shapes only (no device sync) and returns no locate function."""
    rows: List[int] = list(range(B))
    if cache_batch_idx is None:
        if k_cache.shape[0] != B:
            raise InputError(f"k_cache has {k_cache.shape[0]} rows but q has batch {B}; pass cache_batch_idx (int32, "
                             f"(B,)) to choose the cache row of each sequence, or a cache of batch {B}")
    else:
        check_index_tensor("cache_batch_idx", cache_batch_idx, 1, device, "the cache row of each sequence, (B,)")
        if cache_batch_idx.shape[0] != B:
            raise InputError(f"cache_batch_idx must have one entry per sequence, (B,) = ({B},), got "
                             f"{tuple(cache_batch_idx.shape)}")
        if not values:
            return None, k_cache.shape[2]
        rows = cache_batch_idx.tolist()
        bad = [(b, r) for b, r in enumerate(rows) if not 0 <= r < k_cache.shape[0]]
        if bad:
            b, r = bad[0]
            raise InputError(f"cache_batch_idx[{b}] = {r} is outside the cache's {k_cache.shape[0]} rows; entries "
                             f"must be in [0, {k_cache.shape[0]})")

    def locate(b, positions):
        return torch.full_like(positions, rows[b]), positions

    return locate, k_cache.shape[2]


def _paged_layout(B: int, device, k_cache, page_table, cache_batch_idx) -> Tuple[Locate, int]:
    """(locate, capacity) of a paged cache (shapes only: no device sync); the page table must be on ``device``."""
    if cache_batch_idx is not None:
        raise InputError("cache_batch_idx does not apply to a paged cache (as in flash_attn_with_kvcache); select "
                         "the sequences' pages with the rows of page_table instead (page_table[cache_batch_idx])")
    check_index_tensor("page_table", page_table, 2, device, "(B, max_pages): the pages of each sequence")
    if page_table.shape[0] != B:
        raise InputError(f"page_table must have one row per sequence, (B, max_pages) with B = {B}, got "
                         f"{tuple(page_table.shape)}")
    page_size = k_cache.shape[2]
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise InputError(f"page_size (k_cache.shape[2]) must be 1 to {MAX_PAGE_SIZE}, got {page_size}; use smaller "
                         "pages (more of them)")
    table = page_table.long()

    def locate(b, positions):
        return table[b, torch.div(positions, page_size, rounding_mode="floor")], positions % page_size

    return locate, page_table.shape[1] * page_size


def _cache_seqlens(cache_seqlens, B: int, device, capacity: int, L_new: int, values: bool = True) -> List[int]:
    """The cached lengths before the append, one per sequence, each checked against the capacity. ``values=False``
    checks a tensor's shape only (no device sync) and returns None for it."""
    if cache_seqlens is None:
        if L_new:
            raise InputError("appending k/v needs cache_seqlens (the cached length of each sequence, where the new "
                             "keys go): pass an int or an int32 tensor (B,)")
        return [capacity] * B  # no lengths: every sequence fills its cache
    if isinstance(cache_seqlens, torch.Tensor):
        check_index_tensor("cache_seqlens", cache_seqlens, 1, device, "the cached length of each sequence, (B,)")
        if cache_seqlens.shape[0] != B:
            raise InputError(f"cache_seqlens must have one entry per sequence, (B,) = ({B},), got "
                             f"{tuple(cache_seqlens.shape)}")
        if not values:
            return None
        starts = cache_seqlens.tolist()
    else:
        starts = [check_nonnegative_int("cache_seqlens", cache_seqlens, "an int or an int32 tensor (B,)")] * B
    for b, s in enumerate(starts):
        if s < 0:
            raise InputError(f"cache_seqlens[{b}] = {s} is negative; cached lengths are >= 0")
        if s + L_new > capacity:
            raise InputError(f"sequence {b} holds {s} cached keys and appends {L_new}, {s + L_new} in all, over the "
                             f"cache's capacity of {capacity} keys per sequence; give the cache more room (a longer "
                             "L_max, or more pages per page_table row)")
    return starts


def _check_pages(page_table, num_pages: int, page_size: int, starts: List[int], L_new: int) -> None:
    """Every page a sequence reads or writes (those covering positions < s_b + L_new) exists and appears once in
    its row (twice, an append would overwrite the sequence's own keys); the rest of a row is never read, so
    padding there (-1, say) is allowed."""
    for b, s in enumerate(starts):
        used = page_table[b, :math.ceil((s + L_new) / page_size)]
        bad = ((used < 0) | (used >= num_pages)).nonzero()
        if bad.numel():
            j = int(bad[0, 0])
            raise InputError(f"page_table[{b}, {j}] = {int(used[j])} is not a page of the cache (it has {num_pages}); "
                             f"sequence {b} uses its first {used.numel()} entries, which must be in [0, {num_pages})")
        first: dict = {}  # page -> its first entry in the row
        for j, page in enumerate(used.tolist()):
            i = first.setdefault(page, j)
            if i != j:
                raise InputError(f"page_table[{b}, {i}] and page_table[{b}, {j}] are both page {page}: sequence {b} "
                                 f"would keep positions {i * page_size} and {j * page_size} (and the rest of those "
                                 "pages) in the same cache slots; list each page at most once in a row")


def _check_options(rotary_interleaved, num_splits, return_lse, scale, D: int) -> float:
    """The call's switches (no tensor values read); returns the scale."""
    if not isinstance(rotary_interleaved, bool):
        raise InputError(f"rotary_interleaved must be a bool (True: GPT-J pairs 2j, 2j+1; False: GPT-NeoX halves), "
                         f"got {rotary_interleaved!r}")
    check_nonnegative_int("num_splits", num_splits, "0 picks the split count automatically")
    check_bool("return_lse", return_lse)
    return _check_scale(scale, D)


def _check_values(attn, q, k_cache, page_table, locate: Locate, starts: List[int], L_new: int, rows_chosen: bool,
                  rotary_cos, rotary_sin, device) -> None:
    """The checks that read the index tensors' values (``page_table`` and ``locate`` on ``device``): pages in the
    cache and once per row, rotary tables long enough, no slot appended by one sequence and used by another, the
    captured tensors long enough for every sequence."""
    B, Hq, Lq = q.shape[:3]
    paged = page_table is not None
    if paged:
        _check_pages(page_table, k_cache.shape[0], k_cache.shape[2], starts, L_new)
    if rotary_cos is not None or rotary_sin is not None:
        rotated = max(Lq, L_new)  # the last rotated position: a query's or a new key's
        check_rotary(rotary_cos, rotary_sin, q, max(starts, default=0) + rotated - 1 if rotated else -1)
    if L_new and (paged or rows_chosen):
        _check_no_shared_writes(locate, starts, L_new, k_cache.shape[2], device)
    for s in starts:
        check_sequence_extents(attn, B, Hq, Lq, s + L_new, s)


def _check_no_shared_writes(locate: Locate, starts: List[int], L_new: int, slots_per_page: int, device) -> None:
    """A cache slot written by one sequence must not be read (or written) by another in the same call: a kernel
    appends and attends per sequence in parallel, so the result would depend on timing. Block by block (a page, or
    a whole cache row), not slot by slot: sequence b reads the first min(U, s_b + L_new - j U) slots of its block j
    and writes from slot max(s_b - j U, 0) on, so a write clashes with another sequence's read of the same block
    exactly when that read reaches past the write's first slot."""
    if not starts or not L_new:
        return
    U = slots_per_page
    ends = [s + L_new for s in starts]
    counts = [-(-e // U) for e in ends]
    seq = torch.repeat_interleave(torch.arange(len(starts), device=device), torch.tensor(counts, device=device))
    j = torch.cat([torch.arange(n, device=device) for n in counts])
    block = torch.cat([locate(b, torch.arange(n, device=device) * U)[0] for b, n in enumerate(counts)])
    reach = (torch.tensor(ends, device=device)[seq] - j * U).clamp(max=U)  # slots [0, reach) read
    first = (torch.tensor(starts, device=device)[seq] - j * U).clamp(min=0)  # slots [first, reach) written
    written = first < reach
    # only blocks listed more than once can clash
    uniq, listed = torch.unique(block, return_counts=True)
    shared = torch.isin(block, uniq[listed > 1])
    w, r = (written & shared).nonzero()[:, 0], shared.nonzero()[:, 0]
    if not w.numel():
        return
    clash = (block[w, None] == block[None, r]) & (seq[w, None] != seq[None, r]) & (reach[None, r] > first[w, None])
    hits = clash.any(1).nonzero()
    if hits.numel():
        k = int(hits[0, 0])  # entries are in (sequence, block) order: the first clash of the first sequence
        b, pos = int(seq[w[k]]), int(j[w[k]]) * U + int(first[w[k]])
        other = int(seq[r[clash[k].nonzero()[0, 0]]])
        raise InputError(f"sequence {b} appends position {pos} into a cache slot that sequence {other} also uses "
                         "in this call; give each sequence its own pages (or cache rows) for the keys it appends")


def _with_kvcache_kernel(attn, q, k_cache, v_cache, k, v, cache_seqlens, page_table, rotary_cos, rotary_sin,
                         rotary_interleaved, cache_batch_idx, num_splits, return_lse, scale):
    """The CUDA path: the reference's checks, those that read values (lengths against the capacity, page ids,
    shared slots, captured-tensor extents) on host copies and not while a CUDA graph is being captured or
    torch.compile traces; then the append (and rotation) with torch ops, and the decode kernel."""
    from .decode import decode
    from .launch import _layout_ok

    B, Hq, Lq, D, Hkv, Dv, L_new = _check_tensors(q, k_cache, v_cache, k, v)
    if Dv != D:
        raise InputError(f"the decode kernel needs v_cache's head dim ({Dv}) equal to k_cache's ({D}); compile with "
                         "backend='reference' for other value head dims")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise InputError(f"the decode kernel takes torch.bfloat16 or torch.float16, got {q.dtype}; convert q and the "
                         "caches, or compile with backend='reference'")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        st = t.stride()
        if not _layout_ok(t, t.shape):
            raise InputError(f"{name} must have a contiguous last dim, 16-byte alignment and strides that are multiples "
                             f"of 8 elements, got strides {tuple(st)}: pass {name}.contiguous() (a cache: allocate it "
                             "with torch.empty / torch.zeros)")
    paged = page_table is not None
    if paged:
        _, capacity = _paged_layout(B, q.device, k_cache, page_table, cache_batch_idx)
    else:
        _, capacity = _contiguous_layout(B, q.device, k_cache, cache_batch_idx, values=False)
    _cache_seqlens(cache_seqlens, B, q.device, capacity, L_new, values=False)  # a tensor's shape, an int's value
    seqlens = cache_seqlens.contiguous() if isinstance(cache_seqlens, torch.Tensor) else None
    scale = _check_options(rotary_interleaved, num_splits, return_lse, scale, D)
    rotary = rotary_cos is not None or rotary_sin is not None
    captured = attn.captured_on(q.device)
    if not (torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()):
        # the checks that read values, on host copies of the index tensors (one wait for them), skipped under capture:
        # the append and the kernel clamp lengths, page ids and cache rows to the cache, so a bad value there touches
        # wrong slots, never outside it
        cpu = torch.device("cpu")
        table, rows, lengths = (t.cpu() if isinstance(t, torch.Tensor) else t
                                for t in (page_table, cache_batch_idx, cache_seqlens))
        locate, _ = (_paged_layout(B, cpu, k_cache, table, None) if paged
                     else _contiguous_layout(B, cpu, k_cache, rows))
        starts = _cache_seqlens(lengths, B, cpu, capacity, L_new)
        _check_values(attn, q, k_cache, table, locate, starts, L_new, rows is not None, rotary_cos, rotary_sin, cpu)
    elif rotary:
        # the positions are on the device: the tables must cover every one this cache can hold, or a rotation
        # past their end would be clamped to their last row, silently
        check_rotary(rotary_cos, rotary_sin, q, -1)
        last = capacity - 1 + max(Lq - L_new, 0)
        if rotary_cos.shape[0] <= last:
            raise InputError(f"rotary_cos has {rotary_cos.shape[0]} rows, but under CUDA-graph capture or torch.compile "
                             f"the tables must cover every position the cache can hold ({last + 1}: its capacity "
                             f"{capacity}{f' plus {Lq - L_new} queries past the new keys' if Lq > L_new else ''}), "
                             f"since the lengths are not read then; build them for {last + 1} positions")
    default = capacity if cache_seqlens is None else (0 if seqlens is not None else int(cache_seqlens))

    with torch.no_grad():  # an inference entry point: the cache is written in place
        # each sequence's first new position, on the device only when an append or a rotation needs it: a graph
        # of a plain decode step holds the attention kernels alone
        base = ((seqlens.long().clamp(min=0) if seqlens is not None
                 else torch.full((B,), default, device=q.device)).view(B, 1) if L_new or rotary else None)

        def rotate(x, n):  # x (B, H, n, D) at positions s_b .. s_b + n - 1
            if not rotary:
                return x
            pos = (base + torch.arange(n, device=q.device)).clamp_(max=rotary_cos.shape[0] - 1)
            return apply_rotary(x, rotary_cos, rotary_sin, pos.unsqueeze(1), rotary_interleaved)

        if L_new:
            # clamped to the cache as the kernel clamps its reads: no-ops after the eager checks, and under capture a
            # bad value writes the wrong slot of this cache, never outside it (or a device assert)
            pos = (base + torch.arange(L_new, device=q.device)).clamp_(0, capacity - 1)  # (B, L_new)
            if paged:
                pages = torch.div(pos, k_cache.shape[2], rounding_mode="floor")
                major = page_table.long().gather(1, pages).clamp_(0, k_cache.shape[0] - 1)
                minor = pos % k_cache.shape[2]
            else:
                rows = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(B, device=q.device)
                major, minor = rows.clamp(0, k_cache.shape[0] - 1).view(B, 1).expand(B, L_new), pos
            k_cache[major, :, minor] = rotate(k, L_new).permute(0, 2, 1, 3)
            v_cache[major, :, minor] = v.permute(0, 2, 1, 3)
        lib = attn.decode_library(q.dtype, D, q.get_device())
        return decode(lib, rotate(q, Lq), k_cache, v_cache, seqlens=seqlens, seqlen_default=default, kv_extra=L_new,
                      page_table=page_table.contiguous() if paged else None,
                      cache_batch_idx=cache_batch_idx.contiguous() if cache_batch_idx is not None and not paged else None,
                      num_splits=num_splits, scale=scale, return_lse=return_lse, captured=captured,
                      params=attn._param_fields())
