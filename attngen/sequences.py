"""One sequence at a time: what the KV-cache (kvcache.py) and varlen (varlen.py) reference paths share.

Both entry points give every sequence of a batch its own lengths and its own query offset, which
``reference.attention`` (one q_offset, one kv length per call) cannot express for a whole batch. So they call
it once per sequence, on a batch of one, with the variant's ``b`` shifted back to the sequence number: a mod
that reads ``doc_ids[b, q_idx]`` sees the same ``b`` it would in a batched kernel.

Also here: the error for what an entry point cannot do on CUDA tensors yet (GpuPathNotAvailable), and the checks of
the int32 index tensors (lengths, page tables, offsets) both entry points take.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .errors import AttngenError, InputError
from .ir import check_extents
from .mods import MaskMod, ScoreMod, Variant


class GpuPathNotAvailable(AttngenError, NotImplementedError):
    """An entry point was called on CUDA tensors with a kernel backend for something its kernels cannot do yet
    (varlen with a variant that reads b); the message names backend='reference' as the way to run it."""


def check_index_tensor(name: str, t, ndim: int, device: torch.device, what: str) -> torch.Tensor:
    """``t`` as an int32 tensor of rank ``ndim`` on ``device``; InputError naming the fix otherwise.

    int32 only, as flash-attn: the kernels will read these tensors directly, and accepting int64 here would
    make a CPU-tested call fail on the GPU."""
    if not isinstance(t, torch.Tensor):
        raise InputError(f"{name} must be an int32 torch.Tensor ({what}), got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise InputError(f"{name} must have dtype torch.int32 ({what}), got {t.dtype}; convert it with "
                         f"{name}.to(torch.int32)")
    if t.dim() != ndim:
        raise InputError(f"{name} must be {ndim}-D ({what}), got shape {tuple(t.shape)}")
    if t.device != device:
        raise InputError(f"{name} is on {t.device} but q is on {device}; move it with {name}.to('{device}')")
    return t


def check_nonnegative_int(name: str, value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputError(f"{name} must be an int >= 0 ({what}), got {value!r}")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"{name} must be a bool, got {value!r}")
    return value


def shifted_variant(variant: Variant, b0: int = 0, kv0=0) -> Variant:
    """``variant`` with its mods called at batch index ``b + b0`` and key index ``kv + kv0``: the variant seen by
    sequence ``b0`` when it runs as a batch of one, or by a chunk of keys that starts at ``kv0`` (an int, or a
    runtime parameter: one build for every chunk, attngen.distributed)."""
    if isinstance(kv0, int) and b0 == 0 and kv0 == 0:
        return variant
    sm, mm = variant.score_mod, variant.mask_mod
    return Variant(
        score_mod=None if sm is None else ScoreMod(lambda s, b, h, q, kv: sm(s, b + b0, h, q, kv + kv0), sm._name),
        mask_mod=None if mm is None else MaskMod(lambda b, h, q, kv: mm(b + b0, h, q, kv + kv0), mm._name),
    )


def check_sequence_extents(attn, batch: int, Hq: int, q_len: int, kv_len: int, q_offset: int) -> None:
    """InputError when a captured tensor is too short for one sequence of a batch of ``batch``: its positions
    (``q_len`` queries from ``q_offset``, ``kv_len`` keys) and the whole batch's ``b`` range. Callers check every
    sequence before writing anything (a KV-cache append) or attending any (``attend_sequence`` does not check)."""
    if attn.facts.captured:
        check_extents(attn.facts.captured, [c.tensor for c in attn.facts.captured], batch, Hq, q_len, kv_len,
                      q_offset)


def attend_sequence(attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: int, q_offset: int,
                    scale) -> Tuple[torch.Tensor, torch.Tensor]:
    """Reference attention of sequence ``b`` of a batch: q (1, Hq, Lq, D), k (1, Hkv, Lk, D),
    v (1, Hkv, Lk, Dv), query row i at absolute position ``q_offset + i``. Returns (out, lse) of that sequence.
    Captured tensors must have been checked first (``check_sequence_extents``)."""
    from . import reference

    return reference.attention(q, k, v, shifted_variant(attn.variant, b), scale=scale, return_lse=True,
                               q_offset=q_offset)
