"""Rotary position embedding (RoPE) as ``flash_attn_with_kvcache`` applies it to q and the appended keys.

``cos`` and ``sin`` are (L_rot, rotary_dim / 2) tables indexed by absolute position; the first ``rotary_dim``
channels of each head rotate, the rest pass through. Two pairings of those channels:

  half-split (GPT-NeoX, ``interleaved=False``): channel j pairs with j + rotary_dim/2
  interleaved (GPT-J, ``interleaved=True``):    channel 2j pairs with 2j + 1

and each pair (x1, x2) at position p becomes (x1 cos - x2 sin, x1 sin + x2 cos) with cos = cos[p, j].
The products are formed in float32 (float64 for float64 inputs) and rounded once to the input dtype, as a
fused kernel that rotates in registers before storing the keys to the cache does.
"""
from __future__ import annotations

import torch

from .errors import InputError
from .reference import compute_dtype


def check_rotary(cos, sin, q: torch.Tensor, max_position: int) -> int:
    """Validate the cos/sin tables against q (B, H, L, D) and the largest position they must cover; returns
    rotary_dim."""
    if (cos is None) != (sin is None):
        raise InputError("rotary_cos and rotary_sin come together: pass both (L_rot, rotary_dim / 2) tables, or neither")
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor (L_rot, rotary_dim / 2), got {type(t).__name__}")
        if t.dim() != 2 or t.shape[1] == 0:
            raise InputError(f"{name} must be 2-D (L_rot, rotary_dim / 2) with rotary_dim / 2 >= 1, got shape "
                             f"{tuple(t.shape)}; e.g. torch.cos(positions[:, None] * inv_freq[None, :])")
        if t.dtype != q.dtype:
            raise InputError(f"{name} must have q's dtype {q.dtype} (as in flash_attn_with_kvcache), got {t.dtype}; "
                             f"convert it with {name}.to({q.dtype})")
        if t.device != q.device:
            raise InputError(f"{name} is on {t.device} but q is on {q.device}; move it with {name}.to('{q.device}')")
    if cos.shape != sin.shape:
        raise InputError(f"rotary_cos and rotary_sin must have one shape, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    rotary_dim = 2 * cos.shape[1]
    if rotary_dim > q.shape[-1]:
        raise InputError(f"rotary_cos has {cos.shape[1]} columns, so rotary_dim = {rotary_dim}, more than the head "
                         f"dim {q.shape[-1]}; the tables need rotary_dim / 2 <= {q.shape[-1] // 2} columns")
    if max_position >= cos.shape[0]:
        raise InputError(f"rotary_cos has {cos.shape[0]} rows but this call needs position {max_position} (the "
                         f"last new key or query: cache_seqlens + length - 1); build the tables for at least "
                         f"{max_position + 1} positions")
    return rotary_dim


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                 interleaved: bool) -> torch.Tensor:
    """``x`` (..., L, D) rotated at ``positions`` (L,) (absolute, into the tables); a new tensor of x's dtype."""
    half = cos.shape[1]
    rd = 2 * half
    compute = compute_dtype(x.dtype)
    c = cos[positions].to(compute)  # (L, rd/2): broadcasts over the leading dims of x
    s = sin[positions].to(compute)
    xr = x[..., :rd].to(compute)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    o1 = x1 * c - x2 * s
    o2 = x1 * s + x2 * c
    rotated = torch.stack((o1, o2), dim=-1).flatten(-2) if interleaved else torch.cat((o1, o2), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rd:]), dim=-1)
