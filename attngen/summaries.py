"""Runtime per-block summaries of captured tensors: O(N) torch code run at call time.

The predicates (predicates.py) read them as ``ILoad(s<k>, block)``; each is described by a plain tuple
(``Summary.spec``) so an analysis record on disk can rebuild it without sympy:

* ``("reduce", name, axis, which, rank)``: min or max of tensor ``name`` per q- or kv-block;
* ``("equal_range", name, along_kv, which, rank, full)``: per block of one axis, the first / one-past-last
  block of the other axis holding an equal value (document ids), or whose every value is equal (``full``).
"""
from __future__ import annotations

import torch

from .errors import InputError


def compute_fn(spec):
    """The ``compute(tensors, BQ, BK, QLEN, KVLEN, QOFF)`` function a summary spec describes."""
    kind, *args = spec
    if kind == "reduce":
        return _block_reduce(*args)
    if kind == "equal_range":
        return _equal_range(*args)
    raise ValueError(f"unknown summary kind {kind!r}")


def _blocks_of(t2, start, length, blk):
    """(min, max) per block of t2[:, start:start+length], each (rows, nblocks)."""
    nb = -(-length // blk)
    seg = t2[:, start : start + length]
    if seg.shape[1] < length:
        raise InputError(
            f"a captured tensor has {t2.shape[1]} positions but the mask reads index {start + length - 1}; "
            "make it cover q_offset + q_len and kv_len"
        )
    pad = nb * blk - length
    fill = seg[:, -1:].expand(-1, pad) if pad else seg[:, :0]
    segp = torch.cat([seg, fill], dim=1).reshape(seg.shape[0], nb, blk)
    return segp.amin(dim=2), segp.amax(dim=2)


def _equal_range(name, along_kv, which, rank, full=False):
    def compute(tensors, BQ, BK, QLEN, KVLEN, QOFF):
        t = tensors[name]
        t2 = t.reshape(1, -1) if rank == 1 else t
        qmin, qmax = _blocks_of(t2, QOFF, QLEN, BQ)
        kmin, kmax = _blocks_of(t2, 0, KVLEN, BK)
        if not along_kv:  # q-blocks per kv-block: swap roles
            qmin, qmax, kmin, kmax = kmin, kmax, qmin, qmax
        if full:
            # blocks whose every value equals our single value v: kmin >= v and kmax <= v. Binary
            # search needs sorted per-block extremes, so an unsorted row gets an empty range (sound).
            kmin, kmax = kmin.contiguous(), kmax.contiguous()
            side = dict(right=False) if which == "lo" else dict(right=True)
            r = torch.searchsorted(kmin if which == "lo" else kmax, qmin.contiguous(), **side)
            ok = (qmin == qmax) & (kmin[:, 1:] >= kmin[:, :-1]).all(1, keepdim=True) & (kmax[:, 1:] >= kmax[:, :-1]).all(1, keepdim=True)
            return torch.where(ok, r, torch.zeros_like(r)).reshape(-1).to(torch.int32).contiguous()
        if which == "lo":  # first block whose running max reaches the smallest value of ours
            seq = torch.cummax(kmax, dim=1).values.contiguous()
            r = torch.searchsorted(seq, qmin.contiguous(), right=False)
        else:  # one past the last block whose suffix min is within our largest value
            seq = torch.flip(torch.cummin(torch.flip(kmin, [1]), dim=1).values, [1]).contiguous()
            r = torch.searchsorted(seq, qmax.contiguous(), right=True)
        return r.reshape(-1).to(torch.int32).contiguous()

    return compute


# Integer values a per-block min / max summary may hold: the kernels read the summaries as int32 and the tile
# classifier subtracts them (document masks: s2[j] - s1[i]) in int32, so values strictly within +-2^30 keep every
# difference and a small constant offset from overflowing, and clear of the +-2^30 the printer writes for an unbounded
# block bound (+-oo).
_SUMMARY_BOUND = 1 << 30


def _may_exceed_bound(dtype) -> bool:
    """Integer dtypes that can hold values outside (-2^30, 2^30) (int32, int64, uint32, uint64)."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return False
    info = torch.iinfo(dtype)
    return info.min <= -_SUMMARY_BOUND or info.max >= _SUMMARY_BOUND


def _within_bound(x: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor: every value of x strictly within +-2^30 (no host sync)."""
    return ((x > -_SUMMARY_BOUND) & (x < _SUMMARY_BOUND)).all()


def out_of_range_message(name, dtype, values=None) -> str:
    seen = f" ({int(values.min())} .. {int(values.max())})" if values is not None else ""
    return (f"captured tensor {name} ({dtype}) holds values outside (-2^30, 2^30){seen}; the kernels read its "
            "per-block minima and maxima as int32 and subtract them, so with such values attngen could not skip its "
            "blocks soundly. Fix: map the values into that range keeping their order and equality, e.g. for document "
            "ids `ids = torch.unique(ids, sorted=True, return_inverse=True)[1].to(torch.int32)`, and compile the "
            "variant with that tensor")


def device_assert_message(name, dtype) -> str:
    """out_of_range_message's gist for a device assert, whose message torch caps below 255 characters."""
    name = name if len(name) <= 40 else name[:37] + "..."
    return (f"attngen: captured tensor {name} ({dtype}) holds values outside (-2^30, 2^30); remap them keeping order, "
            "e.g. torch.unique(ids, sorted=True, return_inverse=True)[1].to(torch.int32)")


def check_value_ranges(summaries, tensors) -> None:
    """Raise InputError when a captured tensor on a GPU that per-block min / max summaries read holds integers outside
    (-2^30, 2^30) (_SUMMARY_BOUND), once per tensor at compile time, where a host sync costs nothing; each
    recomputation of the summaries checks again without one (_narrowed). A tensor on the CPU feeds no kernel (the
    reference path needs no summaries); block_map's summaries of it check themselves."""
    for name in dict.fromkeys(s.spec[1] for s in summaries if s.spec and s.spec[0] == "reduce"):
        t = tensors[name]
        if t.is_cuda and _may_exceed_bound(t.dtype) and t.numel() and not bool(_within_bound(t)):
            raise InputError(out_of_range_message(name, t.dtype, t))


def _narrowed(red, which, name, dtype):
    """A per-block min or max as the kernels read it (int32, float32), never tighter than the truth: float64 rounded
    outwards (down for a min, up for a max), integers checked to lie within +-2^30 (on the CPU an InputError, on a
    GPU an asynchronous device assert: no host sync on the call path), since a wrapped bound, an overflowing
    difference of two bounds or an inward-rounded one could make a tile look empty or full when it is not."""
    if red.dtype.is_floating_point:
        f = red.to(torch.float32)
        if red.dtype == torch.float64:
            inward = f.double() > red if which == "min" else f.double() < red
            toward = torch.full_like(f, float("-inf") if which == "min" else float("inf"))
            f = torch.where(inward, torch.nextafter(f, toward), f)
        return f
    if _may_exceed_bound(red.dtype) and red.numel():
        fits = _within_bound(red)
        if red.is_cuda:
            torch._assert_async(fits, device_assert_message(name, dtype))
        elif not bool(fits):
            raise InputError(out_of_range_message(name, dtype, red))
    return red.to(torch.int32)


def _block_reduce(name, axis, which, rank):
    """Host/GPU-side O(N) computation of a per-block min or max of a captured tensor."""

    def compute(tensors, BQ, BK, QLEN, KVLEN, QOFF):
        t = tensors[name]
        t2 = t.reshape(1, -1) if rank == 1 else t
        start, length, blk = (QOFF, QLEN, BQ) if axis == "q" else (0, KVLEN, BK)
        bmin, bmax = _blocks_of(t2, start, length, blk)
        red = bmin if which == "min" else bmax
        return _narrowed(red.reshape(-1), which, name, t.dtype).contiguous()

    return compute
