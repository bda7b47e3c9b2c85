"""The tests' golden: dense attention in float64, written independently of attngen.reference.

attngen.reference (chunked float32 attention, also the library's CPU path) is itself under test
(tests/test_reference.py), so nothing here calls it. This module is deliberately plain:

* scores = q . k^T * scale over the whole (B, Hq, Lq, Lk) grid, in float64;
* score_mod(s, b, h, q_idx, kv_idx) and mask_mod(b, h, q_idx, kv_idx) evaluated once, elementwise, on
  broadcast index tensors b (B,1,1,1), h (1,Hq,1,1), q_idx (1,1,Lq,1) + q_offset, kv_idx (1,1,1,Lk);
* GQA / MQA by repeat_interleave of k and v over the head dim;
* a hand-written stable softmax: a row whose every score is masked (or -inf) gives output 0 and
  LSE -inf, and its gradients are 0, never NaN (the max is detached, the normaliser guarded), so
  torch.autograd through this function is a valid gradient reference too.

Works on any device (index tensors are made on q's device).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch

NEG_INF = float("-inf")


def mods_of(variant=None, score_mod: Optional[Callable] = None, mask_mod: Optional[Callable] = None):
    """(score_mod, mask_mod) callables of `variant`: None (full attention), an attngen Variant, anything with a
    `.variant` (what attngen.compile returns), a MaskMod or a ScoreMod; or given explicitly."""
    if variant is None:
        return score_mod, mask_mod
    if score_mod is not None or mask_mod is not None:
        raise TypeError("pass either a variant or score_mod=/mask_mod=, not both")
    v = getattr(variant, "variant", variant)
    if hasattr(v, "score_mod") and hasattr(v, "mask_mod"):
        return v.score_mod, v.mask_mod
    from attngen.mods import MaskMod, ScoreMod

    if isinstance(v, MaskMod):
        return None, v
    if isinstance(v, ScoreMod):
        return v, None
    raise TypeError(f"not a variant: {type(variant).__name__}")


def index_grid(B: int, H: int, Lq: int, Lk: int, q_offset: int = 0, device=None):
    """Broadcast index tensors (b, h, q_idx, kv_idx) of shapes (B,1,1,1), (1,H,1,1), (1,1,Lq,1), (1,1,1,Lk)."""
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    qi = (torch.arange(Lq, device=device) + q_offset).view(1, 1, Lq, 1)
    kv = torch.arange(Lk, device=device).view(1, 1, 1, Lk)
    return b, h, qi, kv


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, variant=None, *, score_mod=None, mask_mod=None,
              scale: Optional[float] = None, q_offset: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense float64 attention. q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv), Hq a multiple of Hkv.

    Returns (out (B, Hq, Lq, Dv), lse (B, Hq, Lq)), both float64; rows with nothing kept give 0 and -inf.
    `scale` defaults to 1/sqrt(D); `q_offset` is the absolute position of the first query."""
    sm, mm = mods_of(variant, score_mod, mask_mod)
    q, k, v = q.double(), k.double(), v.double()
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    assert k.shape[0] == B and v.shape[:3] == (B, Hkv, Lk) and Hq % Hkv == 0, (q.shape, k.shape, v.shape)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    rep = Hq // Hkv
    k = k.repeat_interleave(rep, dim=1)
    v = v.repeat_interleave(rep, dim=1)
    shape = (B, Hq, Lq, Lk)
    if Lk == 0:  # no keys: every row is fully masked
        return q.new_zeros(B, Hq, Lq, v.shape[-1]), q.new_full((B, Hq, Lq), NEG_INF)
    s = (q @ k.transpose(-1, -2)) * scale
    b, h, qi, kv = index_grid(B, Hq, Lq, Lk, q_offset, q.device)
    if sm is not None:
        s = torch.broadcast_to(torch.as_tensor(sm(s, b, h, qi, kv), device=q.device), shape).double()
    if mm is not None:
        keep = torch.broadcast_to(torch.as_tensor(mm(b, h, qi, kv), device=q.device), shape)
        assert keep.dtype == torch.bool, f"mask_mod returned {keep.dtype}, not bool"
        s = torch.where(keep, s, torch.full_like(s, NEG_INF))
    row_max = s.detach().amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(s - row_max)
    z = e.sum(dim=-1, keepdim=True)
    nonempty = z > 0
    z_safe = torch.where(nonempty, z, torch.ones_like(z))
    out = (e @ v) / z_safe
    lse = torch.where(nonempty, torch.log(z_safe) + row_max, torch.full_like(z, NEG_INF)).squeeze(-1)
    return out, lse
