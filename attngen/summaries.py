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


def _block_reduce(name, axis, which, rank):
    """Host/GPU-side O(N) computation of a per-block min or max of a captured tensor."""

    def compute(tensors, BQ, BK, QLEN, KVLEN, QOFF):
        t = tensors[name]
        t2 = t.reshape(1, -1) if rank == 1 else t
        start, length, blk = (QOFF, QLEN, BQ) if axis == "q" else (0, KVLEN, BK)
        bmin, bmax = _blocks_of(t2, start, length, blk)
        red = bmin if which == "min" else bmax
        dt = torch.int32 if not red.dtype.is_floating_point else torch.float32
        return red.reshape(-1).to(dt).contiguous()

    return compute
