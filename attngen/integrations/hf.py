"""Hugging Face transformers: ``attn_implementation="attngen"``.

    import attngen.integrations.hf
    attngen.integrations.hf.register()
    model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="attngen")

``register()`` adds two functions under one name: an attention function (transformers' ``AttentionInterface``)
and a mask function (``AttentionMaskInterface``), which decides what the attention function receives as
``attention_mask``: ``None`` when nothing but the variant masks, else a (batch, kv_len) int32 tensor of segment
ids, -1 on padded keys (attngen/integrations/_segments.py). The model's settings map to a variant:

    module.is_causal / is_causal kwarg      causal=True (queries aligned to the end of the keys: q_offset = Lk - Lq)
    sliding_window kwarg (per layer)        window=W (causal: kv in (q-W, q], as transformers' masks), (W, W) if not
    softcap kwarg (attn_logit_softcapping)  softcap=c, applied to the scaled scores before masking
    scaling                                 scale
    fewer kv heads (GQA)                    passed as is (attngen reads kv head h // (Hq // Hkv))
    2D attention_mask (left/right padding)  padded keys dropped through the segment tensor
    packed rows (position_ids restarting)   a query sees only its own segment (segments read off the mask function)

Compiled variants are cached per (causal, window, softcap) and segment form, so a model compiles a handful of
variants once, whatever its number of layers or calls. What attngen cannot express raises ``InputError`` naming it
and the fix: a 4D mask (an arbitrary float bias or boolean mask), dropout, attention sinks (``s_aux``), position
biases, chunked attention, custom ``or_mask_function`` / ``and_mask_function`` overlays, static caches.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..errors import InputError
from ._cache import compiled
from ._segments import segment_attention

NAME = "attngen"
_OTHERS = 'attn_implementation="sdpa" or "eager"'


def register(name: str = NAME) -> str:
    """Make ``attn_implementation=name`` (default "attngen") available to every transformers model; returns the name.

    Needs transformers 5 (``pip install "attngen[hf]"``). Calling it again is harmless."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError(
            f"attngen.integrations.hf needs transformers>=5 ({e}); install it with: pip install 'attngen[hf]'"
        ) from None
    from transformers import masking_utils

    # the mask function runs inside the model's forward, which torch.compile traces: it must not import
    # (transformers' lazy modules are a graph break), so it reads what it needs from here
    _MASKING.update(causal=masking_utils.causal_mask_function,
                    bidirectional=masking_utils.bidirectional_mask_function,
                    padding=masking_utils.prepare_padding_mask)
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    return name


_MASKING: dict = {}  # transformers.masking_utils' functions attention_mask compares with / calls (register)


def _unsupported(what: str, fix: str) -> InputError:
    return InputError(f'attn_implementation="attngen" does not support {what}. {fix}')


# ----------------------------------------------------------------------------------------------------------
# the mask function (AttentionMaskInterface): what the attention function gets as attention_mask


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0, mask_function=None,
                   attention_mask: Optional[torch.Tensor] = None, use_vmap: bool = False, device="cpu", **kwargs):
    """``None``, or a (batch, kv_length) int32 tensor of segment ids with -1 on padded keys."""
    if not _MASKING:
        register()
    causal, bidirectional = _MASKING["causal"], _MASKING["bidirectional"]
    if use_vmap:
        raise _unsupported("custom mask overlays (or_mask_function / and_mask_function, e.g. bidirectional image "
                           "tokens)", f"Use {_OTHERS} for this model.")
    base = mask_function is None or mask_function is causal or mask_function is bidirectional
    if isinstance(q_offset, torch.Tensor) or (
            mask_function is not bidirectional and q_offset - kv_offset != kv_length - q_length):
        raise _unsupported(
            "a cache whose keys do not end at the last query (a static cache: cache_implementation='static')",
            "Use the default dynamic cache, or " + _OTHERS + ".")
    seg = None
    if not base and attention_mask is None and q_length == kv_length and q_offset == 0 and kv_offset == 0:
        seg = _segments_of(mask_function, batch_size, kv_length, device)
    if attention_mask is not None:
        keep = _MASKING["padding"](attention_mask, kv_length, kv_offset)[:, kv_offset:kv_offset + kv_length]
        keep = keep.to(device=device, dtype=torch.bool)
        seg = torch.where(keep, 0 if seg is None else seg, -1).to(torch.int32)
    if seg is not None and not torch.compiler.is_compiling():
        # eager: nothing padded, one segment per row needs no mask (compiled this would be a graph break; under
        # CUDA-graph capture a sync, and the mask must stay for the padding of later replays)
        if not (seg.is_cuda and torch.cuda.is_current_stream_capturing()) and not bool(seg.any()):
            return None
    return seg


def _segments_of(mask_function, batch_size: int, length: int, device) -> torch.Tensor:
    """Segment ids (batch, length) of a mask function of transformers' (packed rows, sliding windows): token i
    starts a new segment where it may not see token i - 1. O(batch x length) evaluations of the mask function."""
    b = torch.arange(batch_size, device=device)[:, None]
    i = torch.arange(1, length, device=device)[None, :]
    sees_previous = mask_function(b, 0, i, i - 1).expand(batch_size, length - 1)
    if not torch.compiler.is_compiling():
        # a causal mask must not see the next token; a bidirectional one sees it exactly when it sees the previous
        sees_next = mask_function(b, 0, i - 1, i).expand(batch_size, length - 1)
        if bool(sees_next.any()) and not torch.equal(sees_next, sees_previous):
            raise _unsupported("masks with bidirectional blocks inside a causal mask (block_sequence_ids, "
                               "token_type_ids of image tokens)", f"Use {_OTHERS} for this model.")
    starts = (~sees_previous).to(torch.int32).cumsum(-1)
    return torch.cat([starts.new_zeros(batch_size, 1), starts], dim=1)


# ----------------------------------------------------------------------------------------------------------
# the attention function (AttentionInterface)


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: Optional[torch.Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs):
    """transformers' attention function signature: q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D); returns
    (output (B, Lq, Hq, D), None)."""
    if dropout:
        raise _unsupported(f"attention dropout (dropout={dropout})",
                           "Set the config's attention_dropout to 0.0, or use " + _OTHERS + " for training with it.")
    for name in ("s_aux", "sinks", "position_bias"):
        if kwargs.get(name) is not None:
            raise _unsupported(f"`{name}` (attention sinks / additive position biases)", f"Use {_OTHERS}.")
    config = getattr(module, "config", None)
    if getattr(config, "attention_chunk_size", None) is not None:
        raise _unsupported("chunked attention (config.attention_chunk_size)", f"Use {_OTHERS}.")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window = None
    if sliding_window is not None:
        window = int(sliding_window) if causal else (int(sliding_window), int(sliding_window))
    softcap = float(softcap) if softcap is not None else None
    scale = float(scaling) if scaling is not None else None
    Lq, Lk = query.shape[2], key.shape[2]
    q_offset = Lk - Lq if causal else 0

    if attention_mask is None:
        attn = compiled(None, None, causal and window is None, window, softcap)
        out = attn(query, key, value, scale=scale, q_offset=q_offset)
    else:
        seg = _as_segments(attention_mask, query.shape[0], Lk)
        out = segment_attention(query, key, value, seg, causal=causal and window is None, window=window,
                                softcap=softcap, form="segments" if causal else "keys", scale=scale,
                                q_offset=q_offset)
    return out.transpose(1, 2).contiguous(), None


def _as_segments(mask, batch: int, kv_len: int) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise _unsupported(f"an attention_mask of type {type(mask).__name__}", f"Pass a 2D padding mask, or use "
                           f"{_OTHERS}.")
    if mask.dim() != 2:
        raise _unsupported(
            f"a {mask.dim()}D attention_mask (shape {tuple(mask.shape)}, dtype {mask.dtype}): an arbitrary "
            "bias or boolean mask per query and key", "Pass the 2D (batch, seq) padding mask the tokenizer gives, "
            "express the pattern as an attngen mask_mod (attngen.compile / attngen.flex_attention), or use "
            + _OTHERS + ".")
    if tuple(mask.shape) != (batch, kv_len):
        raise InputError(f'attn_implementation="attngen": the attention_mask has shape {tuple(mask.shape)}, '
                         f"expected (batch, kv_len) = ({batch}, {kv_len})")
    if mask.dtype == torch.int32:  # segment ids from attention_mask() above
        return mask
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise _unsupported(f"a 2D {mask.dtype} attention_mask (an additive bias?)", "Pass the tokenizer's 0/1 "
                           f"padding mask (int64 or bool), or use {_OTHERS}.")
    # a raw padding mask (the tokenizer's int64 0/1, or bool; nonzero = keep) handed over without the mask
    # function: its values are not segment ids (0 would keep a padded key)
    return torch.where(mask.to(torch.bool), 0, -1).to(torch.int32)
