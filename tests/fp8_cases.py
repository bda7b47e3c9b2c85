"""FP8 (e4m3) forward cases shared by the CPU checks (tests/test_fp8.py) and the GPU suite (tests/gpu/test_fp8_gpu.py):
seeded e4m3 inputs with descales, dequantisation, the eager implementation the suite's criterion is measured against,
the variants and shapes. The device is an argument, so the CPU tests run the same cases."""
from __future__ import annotations

import math

import torch

import attngen
from attngen import reference

E4M3 = torch.float8_e4m3fn

SHAPES = [  # B, Hq, Hkv, Lq, Lk, q_offset
    (2, 4, 4, 256, 256, 0),
    (1, 4, 2, 200, 333, 133),   # GQA, odd lengths, q_len != kv_len: the queries are the last 200 positions
    (2, 4, 1, 77, 77, 0),       # MQA, one partial q tile, Lk not a multiple of 16
]


def inputs(gen, B, Hq, Hkv, Lq, Lk, D=128, device="cpu"):
    """e4m3 q, k, v (values about randn / descale) and descales (B, Hkv) in [0.02, 0.06]."""
    q, k, v = (torch.randn(B, h, L, D, generator=gen) for h, L in ((Hq, Lq), (Hkv, Lk), (Hkv, Lk)))
    ds = [torch.rand(B, Hkv, generator=gen) * 0.04 + 0.02 for _ in range(3)]
    q8, k8, v8 = ((t / d.repeat_interleave(t.shape[1] // Hkv, 1)[:, :, None, None]).to(E4M3)
                  for t, d in zip((q, k, v), ds))
    return [t.to(device) for t in (q8, k8, v8)], [d.to(device) for d in ds]


def dequant(t, d):
    """float64 values of e4m3 t (B, H, L, D) with descales d (B, Hkv)."""
    return t.double() * d.double().repeat_interleave(t.shape[1] // d.shape[1], 1)[:, :, None, None]


def scores(attn, q8, k8, v8, ds, q_offset, scale=None):
    """float32 scores of the dequantised inputs after the variant's score_mod and mask (-inf where masked), and v
    with its kv heads repeated to the query heads."""
    _, sm, mm = reference._mods(attn.variant)
    q, k, v = (dequant(t, d).float() for t, d in zip((q8, k8, v8), ds))
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    B, H, Lq, Lk = s.shape
    idx = reference._index_tensors(B, H, q_offset, q_offset + Lq, Lk, q8.device)
    if sm is not None:
        s = reference._eval_score(sm, s, idx, "score_mod")
    if mm is not None:
        s = s.masked_fill(~reference._eval_mask(mm, idx, s.shape, q8.device, "mask_mod"), -math.inf)
    return s, v


def eager_fp8(attn, q8, k8, v8, ds, q_offset, scale=None):
    """float32 attention on the dequantised inputs with P = e^(s - rowmax) rounded to e4m3 for P V (the row sums from
    unrounded P), bf16 out."""
    s, v = scores(attn, q8, k8, v8, ds, q_offset, scale)
    m = s.amax(-1, keepdim=True).nan_to_num(neginf=0.0)
    p = torch.exp(s - m)
    o = (p.to(E4M3).float() @ v) / p.sum(-1, keepdim=True)
    return o.nan_to_num(0.0).to(torch.bfloat16)


def exact(attn, q8, k8, v8, ds, q_offset, scale=None, return_lse=False):
    """float64 attention on the dequantised inputs (the reference)."""
    return reference.attention(*(dequant(t, d) for t, d in zip((q8, k8, v8), ds)), attn.variant, scale=scale,
                               q_offset=q_offset, return_lse=return_lse)


def variants(device="cpu"):
    """The suite's variants: attngen.compile keyword arguments by name."""
    docs = (torch.arange(2048) // 150).to(device)
    table = (torch.randn(4, 4095, generator=torch.Generator().manual_seed(11)) * 0.5).to(device)

    def relpos(s, b, h, q, kv):  # the sm90 kernel stages b per diagonal of a warp (Sm90Tiles.rel_stage)
        return s + table[h, q - kv + 2047]

    return {
        "full": dict(),
        "causal": dict(causal=True),
        "sliding_window": dict(window=96),
        "softcap_causal": dict(softcap=20.0, causal=True),
        "alibi_causal": dict(score_mod=attngen.alibi(4), causal=True),
        "document": dict(mask_mod=attngen.document(docs)),
        "relpos_window": dict(score_mod=relpos, window=96),
    }
