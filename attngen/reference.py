"""Reference attention: plain PyTorch, chunked over queries, with FlexAttention semantics.

This is the numerical ground truth the kernels are tested against, so it favours clarity and exactness
over speed: math in float32 (float64 for float64 inputs), mods evaluated on broadcast index tensors
exactly as a user would evaluate them by hand, every query row processed the same way.

Semantics (same as ``torch.nn.attention.flex_attention``):
  score  = (q . k) * scale                      scale defaults to 1/sqrt(D)
  score  = score_mod(score, b, h, q_idx, kv_idx)
  score  = -inf where not mask_mod(b, h, q_idx, kv_idx)
  out    = softmax(score) @ v,  lse = logsumexp(score)   (natural log)
``q_idx`` is the ABSOLUTE query position row + q_offset, ``kv_idx`` is 0..Lk-1, ``b`` the batch index and
``h`` the QUERY head (query head h reads kv head h // (Hq // Hkv)). A row whose every score is -inf gives
out = 0 and lse = -inf, with finite (zero) gradients.
"""
from __future__ import annotations

import math
import operator
from typing import Optional, Tuple, Union

import torch
import torch.utils.checkpoint

from .errors import InputError
from .mods import as_mask_mod, as_score_mod, as_variant

# Elements of one (B, Hq, chunk, Lk) score block when chunk is chosen automatically: ~64 MiB in fp32.
_AUTO_CHUNK_ELEMENTS = 1 << 24


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The precision of attngen's float sums (the reference, the LSE, merges and gradient accumulators):
    float64 for float64 inputs, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _mods(variant):
    v = as_variant(variant)
    # Variant(...) built by hand may hold plain functions: give them names and the math shim
    sm = as_score_mod(v.score_mod) if v.score_mod is not None else None
    mm = as_mask_mod(v.mask_mod) if v.mask_mod is not None else None
    return v, sm, mm


def _note(err: BaseException, what: str) -> None:
    if hasattr(err, "add_note"):  # Python >= 3.11
        err.add_note(
            f"(while evaluating {what} on the reference path with broadcast index tensors; the mod may only "
            "use operators, comparisons, & | ~, torch.where and elementwise torch math, and captured tensors "
            "it indexes must be on the inputs' device and cover every absolute position)"
        )


def _index_tensors(B: int, H: int, q_lo: int, q_hi: int, Lk: int, device) -> Tuple[torch.Tensor, ...]:
    """b (B,1,1,1), h (1,H,1,1), q_idx (1,1,C,1) holding absolute positions q_lo..q_hi-1, kv_idx (1,1,1,Lk)."""
    b = torch.arange(B, device=device).view(B, 1, 1, 1)
    h = torch.arange(H, device=device).view(1, H, 1, 1)
    q = torch.arange(q_lo, q_hi, device=device).view(1, 1, q_hi - q_lo, 1)
    kv = torch.arange(Lk, device=device).view(1, 1, 1, Lk)
    return b, h, q, kv


def _eval_mask(mask_mod, idx, shape, device, name) -> torch.Tensor:
    try:
        m = mask_mod(*idx)
    except Exception as e:
        _note(e, f"mask_mod {name!r}")
        raise
    if isinstance(m, bool):
        m = torch.tensor(m, device=device)
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        got = m.dtype if isinstance(m, torch.Tensor) else type(m).__name__
        raise InputError(
            f"mask_mod {name!r} must return a bool tensor (True = keep), got {got}; build it from comparisons "
            "combined with & | ~ (not `and`/`or`/`not`, and not * or +)"
        )
    try:
        return m.expand(shape)
    except RuntimeError as e:
        raise InputError(
            f"mask_mod {name!r} returned shape {tuple(m.shape)}, which does not broadcast to {tuple(shape)} "
            "(B, H, q_chunk, Lk); a mask must be elementwise in b, h, q_idx, kv_idx"
        ) from e


def _eval_score(score_mod, s, idx, name) -> torch.Tensor:
    try:
        out = score_mod(s, *idx)
    except Exception as e:
        _note(e, f"score_mod {name!r}")
        raise
    if not isinstance(out, torch.Tensor):
        if isinstance(out, (int, float)):
            return torch.full_like(s, float(out))
        raise InputError(f"score_mod {name!r} must return a tensor (the new score), got {type(out).__name__}")
    if out.dtype == torch.bool or out.is_complex():
        raise InputError(f"score_mod {name!r} must return a real score, got dtype {out.dtype}")
    try:
        return out.to(s.dtype).expand(s.shape)
    except RuntimeError as e:
        raise InputError(
            f"score_mod {name!r} returned shape {tuple(out.shape)}, which does not broadcast to the score "
            f"shape {tuple(s.shape)}; a score_mod must be elementwise"
        ) from e


def _chunk_forward(qc, kf, vf, q_lo, q_offset, scale, score_mod, mask_mod, sm_name, mm_name):
    """One chunk of C query rows. qc (B, Hkv, G, C, D), kf (B, Hkv, 1, Lk, D), vf (B, Hkv, 1, Lk, Dv)."""
    B, Hkv, G, C, _ = qc.shape
    Lk = kf.shape[3]
    Hq = Hkv * G
    s = torch.matmul(qc, kf.transpose(-1, -2)).mul(scale).reshape(B, Hq, C, Lk)
    if score_mod is not None or mask_mod is not None:
        idx = _index_tensors(B, Hq, q_lo + q_offset, q_lo + q_offset + C, Lk, s.device)
    if score_mod is not None:
        s = _eval_score(score_mod, s, idx, sm_name)
    if mask_mod is not None:
        keep = _eval_mask(mask_mod, idx, s.shape, s.device, mm_name)
        s = torch.where(keep, s, torch.tensor(-math.inf, dtype=s.dtype, device=s.device))
    # the row max only stabilises exp(); detached, since softmax does not depend on it
    m = s.detach().amax(dim=-1, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # fully -inf rows: exp(-inf - 0) = 0
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    empty = l == 0
    l_safe = torch.where(empty, torch.ones_like(l), l)  # keeps 1/l and log(l) finite, gradients included
    o = torch.matmul((p / l_safe).reshape(B, Hkv, G, C, Lk), vf).reshape(B, Hq, C, vf.shape[-1])
    lse = torch.where(empty, torch.full_like(l, -math.inf), m + torch.log(l_safe)).squeeze(-1)
    return o, lse


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    variant=None,
    scale: Optional[float] = None,
    return_lse: bool = False,
    q_offset: int = 0,
    chunk: Optional[int] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Reference attention with FlexAttention semantics (see the module docstring).

    q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv), Hq a multiple of Hkv (GQA / MQA).
    ``variant``: a Variant, MaskMod, ScoreMod, compiled attention object, or None (full attention).
    ``q_offset``: absolute position of query row 0 (e.g. decoding against a KV cache).
    ``chunk``: query rows per step; memory is O(B * Hq * chunk * Lk). Default: sized to ~16M scores.
    Returns ``out`` (B, Hq, Lq, Dv) in q.dtype, and with ``return_lse`` also ``lse`` (B, Hq, Lq):
    float32, or float64 when the inputs are float64. Differentiable (q, k, v and captured tensors);
    with several chunks each is recomputed in backward (checkpointing) to keep the O(chunk * Lk) bound.
    """
    v_obj, score_mod, mask_mod = _mods(variant)
    B, Hq, Hkv, Lq, Lk, D, Dv = _check_inputs(q, k, v)
    q_offset = _check_offset(q_offset)
    scale = _check_scale(scale, D)
    compute = compute_dtype(q.dtype)
    if chunk is None:
        chunk = max(1, _AUTO_CHUNK_ELEMENTS // max(1, B * Hq * Lk))
    else:
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise InputError(f"chunk must be a positive int (query rows per step), got {chunk!r}; e.g. chunk=256")
    chunk = min(chunk, max(Lq, 1))

    G = Hq // Hkv
    if Lq == 0 or Lk == 0 or B == 0 or Hq == 0:
        # no keys: every row is fully masked (out 0, lse -inf); no queries: empty results
        out = (q.sum(-1, keepdim=True) * 0).expand(B, Hq, Lq, Dv).to(q.dtype).contiguous()
        if Lk == 0:
            out = out + (k.sum() + v.sum()).to(q.dtype) * 0  # keep the graph connected for autograd
        lse = torch.full((B, Hq, Lq), -math.inf, dtype=compute, device=q.device)
        return (out, lse) if return_lse else out

    qf = q.to(compute).reshape(B, Hkv, G, Lq, D)
    kf = k.to(compute).unsqueeze(2)
    vf = v.to(compute).unsqueeze(2)
    sm_name = score_mod.name if score_mod is not None else None
    mm_name = mask_mod.name if mask_mod is not None else None

    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    # captured tensors that require grad (a learned bias) are not visible here: checkpointing recomputes
    # the chunk including the mods, so their gradients are exact either way
    use_ckpt = needs_grad and Lq > chunk
    outs, lses = [], []
    for lo in range(0, Lq, chunk):
        hi = min(lo + chunk, Lq)
        args = (qf[:, :, :, lo:hi], kf, vf, lo, q_offset, scale, score_mod, mask_mod, sm_name, mm_name)
        if use_ckpt:
            o, l = torch.utils.checkpoint.checkpoint(_chunk_forward, *args, use_reentrant=False, preserve_rng_state=False)
        else:
            o, l = _chunk_forward(*args)
        outs.append(o)
        lses.append(l)
    out = torch.cat(outs, dim=2).to(q.dtype) if len(outs) > 1 else outs[0].to(q.dtype)
    if not return_lse:
        return out
    lse = torch.cat(lses, dim=2) if len(lses) > 1 else lses[0]
    return out, lse


def _check_inputs(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(
                f"{name} must be 4-D (batch, heads, seq_len, head_dim), got shape {tuple(t.shape)}; "
                f"for (batch, seq_len, heads, head_dim) layouts pass {name}.transpose(1, 2)"
            )
        if not t.dtype.is_floating_point:
            raise InputError(f"{name} must be floating point (float16, bfloat16, float32, float64), got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise InputError(
            f"q, k, v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}; convert with .to({q.dtype})"
        )
    if not (q.device == k.device == v.device):
        raise InputError(
            f"q, k, v must be on one device, got q {q.device}, k {k.device}, v {v.device}; move them with .to({q.device})"
        )
    B, Hq, Lq, D = q.shape
    Bk, Hkv, Lk, Dk = k.shape
    Bv, Hv, Lv, Dv = v.shape
    if not (Bk == B and Bv == B):
        raise InputError(f"batch sizes differ: expected k and v batch = q batch = {B}, got k {Bk}, v {Bv}")
    if Hv != Hkv:
        raise InputError(f"k and v must have the same number of heads, got k {Hkv}, v {Hv} (shapes k {tuple(k.shape)}, v {tuple(v.shape)})")
    if Lv != Lk:
        raise InputError(f"k and v must have the same sequence length, got k {Lk}, v {Lv}")
    if Dk != D:
        raise InputError(f"q and k head_dim must match, expected k head_dim {D} (from q), got {Dk}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise InputError(
            f"query heads must be a multiple of kv heads (GQA/MQA), got Hq={Hq}, Hkv={Hkv}; use Hkv equal to Hq, "
            f"a divisor of it, or 1 (MQA), or repeat k/v heads to {Hq}"
        )
    return B, Hq, Hkv, Lq, Lk, D, Dv


def _check_scale(scale, D: int) -> float:
    """The softmax scale as a float: 1/sqrt(D) for None."""
    if scale is None:
        return 1.0 / math.sqrt(D)
    try:
        return float(scale)
    except (TypeError, ValueError):
        raise InputError(f"scale must be a number (default 1/sqrt(D)), got {type(scale).__name__}") from None


def _check_offset(q_offset) -> int:
    try:
        if isinstance(q_offset, bool):
            raise TypeError
        off = operator.index(q_offset)
    except TypeError:
        raise InputError(
            f"q_offset must be an int (absolute position of query row 0), got {type(q_offset).__name__}"
        ) from None
    if off < 0:
        raise InputError(f"q_offset must be >= 0 (absolute position of query row 0), got {off}")
    return int(off)


def _mask_chunks(variant, B, H, Lq, Lk, q_offset, device, chunk):
    _, _, mask_mod = _mods(variant)
    q_offset = _check_offset(q_offset)
    for name, val in (("B", B), ("H", H), ("Lq", Lq), ("Lk", Lk)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 0:
            raise InputError(f"{name} must be an int >= 0, got {val!r}")
    if chunk is None:
        chunk = max(1, _AUTO_CHUNK_ELEMENTS // max(1, B * H * Lk))
    for lo in range(0, Lq, chunk):
        hi = min(lo + chunk, Lq)
        shape = (B, H, hi - lo, Lk)
        if mask_mod is None:
            yield lo, hi, torch.ones(shape, dtype=torch.bool, device=device)
        else:
            idx = _index_tensors(B, H, lo + q_offset, hi + q_offset, Lk, device)
            yield lo, hi, _eval_mask(mask_mod, idx, shape, device, mask_mod.name)


def dense_mask(variant, B: int, H: int, Lq: int, Lk: int, q_offset: int = 0, device="cpu",
               chunk: Optional[int] = None) -> torch.Tensor:
    """The variant's mask_mod evaluated at every (b, h, q, kv): bool (B, H, Lq, Lk), True = keep.

    Brute force on broadcast index tensors (q_idx absolute: row + q_offset); all True without a mask_mod.
    Only mask_mod counts: a score_mod that returns -inf is not reflected here.
    """
    out = torch.empty((B, H, Lq, Lk), dtype=torch.bool, device=device)
    for lo, hi, m in _mask_chunks(variant, B, H, Lq, Lk, q_offset, device, chunk):
        out[:, :, lo:hi] = m
    return out


def mask_density(variant, B: int, H: int, Lq: int, Lk: int, q_offset: int = 0, device="cpu",
                 chunk: Optional[int] = None) -> float:
    """Fraction of kept (b, h, q, kv) entries, computed chunk by chunk (never the whole mask at once)."""
    total = B * H * Lq * Lk
    if total == 0:
        return 0.0
    kept = 0
    for _, _, m in _mask_chunks(variant, B, H, Lq, Lk, q_offset, device, chunk):
        kept += int(m.sum().item())
    return kept / total
