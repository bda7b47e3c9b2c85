"""``attngen.flex_attention``: torch's ``flex_attention`` signature, run by attngen.

    from torch.nn.attention.flex_attention import create_block_mask
    block_mask = create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN)
    out = attngen.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

Differences from torch's (docs/user-guide.md, "Integrations"):
- a BlockMask contributes only its ``mask_mod``: its block tensors are ignored, attngen derives which tiles are
  empty, full or partial from the mask_mod itself (so a BlockMask made with ``B=None, H=None`` or at another block
  size is fine, and one whose blocks disagree with its mask_mod is not an error: the mask_mod wins);
- mods must be traceable by attngen (docs/user-guide.md, "What can be traced");
- one compiled variant per (score_mod, mask_mod) pair of function *objects*: define mods once, not per call (a new
  closure per call compiles again and is kept for the life of the process);
- ``kernel_options`` are ignored; ``return_aux`` supports ``lse`` only; CUDA needs bf16/fp16 and head dims
  64/128/256 (CPU runs attngen's reference in float32).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..errors import InputError
from ._cache import compiled


def _mask_mod_of(block_mask):
    if block_mask is None:
        return None
    mask_mod = getattr(block_mask, "mask_mod", None)
    if mask_mod is None:
        raise InputError(f"block_mask must be a torch BlockMask (it has no mask_mod), got {type(block_mask).__name__}")
    from torch.nn.attention.flex_attention import noop_mask

    return None if mask_mod is noop_mask else mask_mod


def flex_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod=None, block_mask=None,
                   scale: Optional[float] = None, enable_gqa: bool = False, return_lse: bool = False,
                   kernel_options=None, *, return_aux=None):
    """Drop-in for ``torch.nn.attention.flex_attention.flex_attention`` (same arguments and returns).

    Args:
        query: (B, Hq, L, E); key (B, Hkv, S, E); value (B, Hkv, S, Ev).
        score_mod: ``score_mod(score, b, h, q_idx, kv_idx) -> score``.
        block_mask: a BlockMask (``create_block_mask``); only its ``mask_mod`` is used.
        scale: defaults to 1/sqrt(E).
        enable_gqa: must be True when Hq != Hkv (as in torch).
        return_lse: also return the natural-log logsumexp (B, Hq, L), float32.
        kernel_options: ignored.
        return_aux: ``AuxRequest(lse=True)`` returns ``(out, AuxOutput(lse=...))``; max_scores is not supported.

    Works under ``torch.compile(fullgraph=True)`` and is differentiable (attngen's custom ops).
    """
    if query.dim() == 4 and key.dim() == 4 and query.shape[1] != key.shape[1] and not enable_gqa:
        raise InputError(
            f"Expect query and key/value to have the same number of heads but got Hq={query.shape[1]} and "
            f"Hkv={key.shape[1]}. Try setting enable_gqa=True for GQA.")
    want_lse = return_lse
    if return_aux is not None:
        if return_lse:
            raise InputError("pass return_lse or return_aux, not both")
        if getattr(return_aux, "max_scores", False):
            raise InputError("attngen.flex_attention does not return max_scores; request AuxRequest(lse=True) only")
        want_lse = bool(getattr(return_aux, "lse", False))
    attn = compiled(score_mod, _mask_mod_of(block_mask))
    result = attn(query, key, value, scale=scale, return_lse=want_lse)
    if return_aux is None:
        return result
    from torch.nn.attention.flex_attention import AuxOutput

    out, lse = result if want_lse else (result, None)
    return out, AuxOutput(lse=lse)
