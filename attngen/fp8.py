"""The FP8 forward: q, k, v in torch.float8_e4m3fn with per-(batch, kv head) descale factors, bfloat16 output, on the
sm90 forward kernel built for e4m3 (docs/user-guide.md, "FP8 inference").

    out = attn(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)   # attngen.compile(...) object

The kernel computes softmax(scale * (q_descale q)(k_descale k)^T) (v_descale v) with S accumulated in float32 and P
rounded to e4m3 for P V. 8-bit wgmma reads no transposed operand, so the kernel takes V transposed, with the kv
columns of every 16 permuted so that P's accumulator registers are already its A fragments (``v_transposed``); this
module makes that copy and the descale block and launches (the inputs checked by launch._check_qkv). The CPU reference
(``reference_forward``) is the same attention on the dequantised inputs, without P's rounding.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from .abi import ERROR_SCALE_NOT_POSITIVE, ERROR_SM90_NO_TMA_ENCODER, ERROR_SM90_TMA_LAYOUT
from .errors import InputError
from .launch import (_NO_PARAMS, _PACK_DESCALE, _PACK_HEAD, _PACK_TAIL, _ZERO_TAIL, _captured_fields, _checked_call,
                     _check_out, _check_scalars, call_on, launch_failed)

FP8 = torch.float8_e4m3fn
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


def v_position(col: int) -> int:
    """Where kv column ``col`` (0..15) of a 16-column group sits in the kernel's V^T (fp8_v_position in
    templates/fwd_sm90.cuh): column 8 a + 2 t + b goes to 4 t + 2 a + b."""
    return 4 * ((col >> 1) & 3) + 2 * (col >> 3) + (col & 1)


def v_transposed(v: torch.Tensor) -> torch.Tensor:
    """The kernel's V operand: v (B, Hkv, Lk, D) e4m3 -> (B, Hkv, D, ceil16(Lk)) contiguous, the kv columns of every
    16 placed by ``v_position``, zeros past Lk (one copy, about 2 bytes moved per element of v)."""
    B, H, L, D = v.shape
    L16 = -(-L // 16) * 16
    x = v.view(torch.uint8)  # byte moves: pad and permute need no e4m3 arithmetic
    if L16 != L:
        x = torch.nn.functional.pad(x, (0, 0, 0, L16 - L))
    # column 8 a + 2 t + b of group n -> position 4 t + 2 a + b: (n, a, t, b, D) -> (D, n, t, a, b)
    x = x.reshape(B, H, L16 // 16, 2, 4, 2, D).permute(0, 1, 6, 2, 4, 3, 5)
    return x.contiguous().view(B, H, D, L16).view(FP8)


def v_transposed_on_gpu(lib, v: torch.Tensor) -> torch.Tensor:
    """``v_transposed`` by the FP8 library's own kernel (attngen_fp8_v_transpose: one pass over v) on v's device and
    current stream; a v whose rows are not 16-byte aligned is made contiguous first."""
    B, H, L, D = v.shape
    s = v.stride()
    if s[3] != 1 or v.data_ptr() % 16 or any(n > 1 and st % 16 for n, st in zip(v.shape[:3], s[:3])):
        v = v.contiguous()  # its 16-byte loads need every stepped stride 16-byte aligned
    vt = torch.empty((B, H, D, -(-L // 16) * 16), dtype=FP8, device=v.device)
    s = v.stride()
    dev = v.get_device()
    rc = call_on(dev, lambda _, stream: lib._fp8_v_transpose(v.data_ptr(), vt.data_ptr(), B, H, L, s[0], s[1], s[2],
                                                             stream), b"")
    if rc != 0:
        raise launch_failed(lib, "FP8 V transpose", rc, f"v {tuple(v.shape)}, strides {tuple(s)}, on {v.device}")
    return vt


def descale_block(descales: Sequence, B: int, Hkv: int, device: torch.device) -> torch.Tensor:
    """(3, B, Hkv) float32 contiguous on ``device``: the q, k and v descale factors, each None (1), a number, or a
    tensor of shape (B, Hkv) (FlashAttention-3's layout), (B, 1), (1, Hkv), (1,) or () broadcast to it. Numbers and
    CPU tensors are checked to be finite and > 0 here; a CUDA tensor is not read back (no synchronisation): the
    kernel makes the output and LSE of a (batch, kv head) with a factor <= 0 or NaN NaN. None and numbers are filled
    in on the device, so only a CPU tensor costs a host-to-device copy."""
    if len(descales) != 3:
        raise InputError(f"descales must be (q_descale, k_descale, v_descale), got {len(descales)} of them")
    if device.type == "cuda" and all(isinstance(d, torch.Tensor) and d.device == device and d.dtype == torch.float32
                                     and tuple(d.shape) == (B, Hkv) for d in descales):
        return torch.stack(tuple(descales))  # the common case (FlashAttention-3's layout) in one kernel, not three
    block = torch.empty((3, B, Hkv), dtype=torch.float32, device=device)
    for row, name, d in zip(block, DESCALE_NAMES, descales):
        if d is None:
            row.fill_(1.0)
            continue
        if isinstance(d, bool) or not isinstance(d, (int, float, torch.Tensor)):
            raise InputError(f"{name} must be None, a number or a float tensor of shape ({B}, {Hkv}) (batch, kv "
                             f"heads), got {type(d).__name__}")
        if not isinstance(d, torch.Tensor):
            if not (math.isfinite(d) and d > 0):
                raise InputError(f"{name} must be finite and > 0 (a quantisation scale), got {d}")
            row.fill_(float(d))
            continue
        if not d.dtype.is_floating_point:
            raise InputError(f"{name} must be a floating-point tensor, got {d.dtype}: pass {name}.float()")
        # a 1-D factor is ambiguous (per batch or per kv head): only one element or a 2-D shape is taken
        if (d.dim() == 1 and d.numel() != 1) or d.dim() > 2 or (d.dim() == 2 and any(
                n not in (1, want) for n, want in zip(d.shape, (B, Hkv)))):
            raise InputError(f"{name} has shape {tuple(d.shape)}, expected ({B}, {Hkv}) (batch, kv heads), ({B}, 1), "
                             f"(1, {Hkv}), (1,) or ()")
        if d.device.type == "cpu" and not bool(torch.all(torch.isfinite(d) & (d > 0))):
            raise InputError(f"{name} must be finite and > 0 (a quantisation scale), got {d.flatten()[:8].tolist()}")
        row.copy_(d.reshape(d.shape if d.dim() == 2 else (1, 1)).expand(B, Hkv))
    return block


def forward(lib, q, k, v, descales=(None, None, None), *, scale: Optional[float] = None, q_offset: int = 0,
            return_lse: bool = False, captured: Sequence[torch.Tensor] = (), summaries: Sequence[torch.Tensor] = (),
            params: Optional[tuple] = None, out: Optional[torch.Tensor] = None, vt: Optional[torch.Tensor] = None):
    """FP8 attention with a library built for e4m3 (lib.dtype is torch.float8_e4m3fn). q (B, Hq, Lq, D), k / v
    (B, Hkv, Lk, D) in e4m3; ``descales`` (q, k, v) as ``descale_block`` takes them. Returns out (B, Hq, Lq, D)
    bfloat16, or (out, lse) with lse (B, Hq, Lq) float32 natural-log of the descaled scores. ``captured``,
    ``summaries``, ``params``: as launch.forward. ``vt``: v's ``v_transposed`` when the caller already has it (a
    benchmark timing the attention kernel alone), else it is made here."""
    if lib.dtype != FP8:
        raise InputError(f"{lib.path} was built for {lib.dtype}, not for FP8 inputs: compile the variant for "
                         "torch.float8_e4m3fn")
    dev = _checked_call(lib, q, k, v, params, captured, summaries)
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    scale, q_offset = _check_scalars(scale, q_offset, D, Lq, Lk)
    if out is None:
        out = torch.empty((B, Hq, Lq, D), dtype=torch.bfloat16, device=q.device)
    else:
        _check_out(out, (B, Hq, Lq, D), torch.bfloat16, q.device)
    lse = torch.empty((B, Hq, Lq), dtype=torch.float32, device=q.device) if return_lse else None
    block = descale_block(descales, B, Hkv, q.device)
    vt_shape = (B, Hkv, D, -(-Lk // 16) * 16)
    if vt is not None and (vt.dtype != FP8 or tuple(vt.shape) != vt_shape or not vt.is_contiguous()
                           or vt.device != q.device or vt.data_ptr() % 16):
        raise InputError(f"vt must be v_transposed(v): a contiguous, 16-byte aligned {vt_shape} torch.float8_e4m3fn "
                         f"tensor on {q.device}, got {vt.dtype} {tuple(vt.shape)} on {vt.device}")
    if B * Hq * Lq == 0:
        return (out, lse) if return_lse else out
    if Lk == 0:  # no keys: every row is empty (the V^T map would have no columns)
        out.zero_()
        return (out, lse.fill_(-math.inf)) if return_lse else out
    if vt is None:
        vt = v_transposed_on_gpu(lib, v)
    _launch(lib, dev, q, k, vt, out, lse, block, scale, q_offset, captured, summaries, params)
    return (out, lse) if return_lse else out


def _launch(lib, dev, q, k, vt, out, lse, block, scale, q_offset, captured, summaries, params) -> None:
    """attngen_fwd of an FP8 library on forward's checked inputs, writing out (and lse)."""
    B, Hq, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    qs, ks, vs, os_ = q.stride(), k.stride(), vt.stride(), out.stride()
    head = _PACK_HEAD.pack(
        q.data_ptr(), k.data_ptr(), vt.data_ptr(), out.data_ptr(), lse.data_ptr() if lse is not None else 0,
        qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], os_[0], os_[1], os_[2],
        B, Hq, Hkv, Lq, Lk, D, float(scale), q_offset,
    )
    tail = (_PACK_TAIL.pack(*_captured_fields(q.device, captured, summaries, params or _NO_PARAMS))
            if captured or summaries or params else _ZERO_TAIL)
    rc = call_on(dev, lib._fwd_fp8, head + tail + _PACK_DESCALE.pack(block.data_ptr()))
    if rc == ERROR_SCALE_NOT_POSITIVE:
        # As launch.forward: without score_mod (or with a(q - kv) * score) the kernel needs scale > 0, and
        # softmax(s qk) = softmax(|s| (-q) k), scale 0 is q = 0 at scale 1 (e4m3's sign is its top bit: -q is exact).
        q = (q.view(torch.uint8) ^ 0x80).view(FP8) if scale < 0 else torch.zeros_like(q.view(torch.uint8)).view(FP8)
        _launch(lib, dev, q, k, vt, out, lse, block, -scale if scale < 0 else 1.0, q_offset, captured, summaries,
                params)
        return
    if rc == ERROR_SM90_TMA_LAYOUT:
        raise InputError(f"the FP8 kernel cannot describe q or k with a TMA map (strides {tuple(q.stride())}, "
                         f"{tuple(k.stride())}) and has no portable kernel to fall back to: pass q.contiguous(), "
                         "k.contiguous()")
    if rc == ERROR_SM90_NO_TMA_ENCODER:
        raise InputError(f"the FP8 kernel needs cuTensorMapEncodeTiled, which this NVIDIA driver lacks, and has no "
                         f"portable kernel to fall back to: update the driver ({lib.error_string(rc)})")
    if rc != 0:
        raise launch_failed(lib, "FP8 attention kernel", rc, f"q {tuple(q.shape)}, k {tuple(k.shape)}, on {q.device}")


def reference_forward(variant, q, k, v, descales=(None, None, None), *, scale=None, return_lse: bool = False,
                      q_offset: int = 0):
    """The FP8 call's semantics on any device: attention (attngen.reference, float32 on the CPU) on q, k, v
    dequantised by their descale factors, the output in bfloat16. The kernel differs from it by P's rounding to
    e4m3 (docs/user-guide.md gives the size of that error)."""
    from . import reference

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dtype != FP8 or t.dim() != 4:
            raise InputError(f"FP8 attention takes 4-D torch.float8_e4m3fn q, k and v, got {name} "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    B, Hq = q.shape[:2]
    Hkv = k.shape[1]
    if k.shape[0] != B or Hkv == 0 or Hq % Hkv != 0:
        raise InputError(f"q {tuple(q.shape)} and k {tuple(k.shape)}: expected one batch size and query heads a "
                         "multiple of kv heads")
    block = descale_block(descales, B, Hkv, q.device)
    wide = torch.float32 if q.device.type == "cpu" else torch.float64

    def dequant(t, d, per_query_head):
        f = d[:, :, None, None].to(wide)
        if per_query_head:
            f = f.repeat_interleave(Hq // Hkv, dim=1)
        return t.to(wide) * f

    res = reference.attention(dequant(q, block[0], True), dequant(k, block[1], False), dequant(v, block[2], False),
                              variant, scale=scale, return_lse=return_lse, q_offset=q_offset)
    if return_lse:
        return res[0].to(torch.bfloat16), res[1].float()
    return res.to(torch.bfloat16)
