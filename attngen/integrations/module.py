"""``AttentionModule``: a compiled variant as an ``nn.Module``."""
from __future__ import annotations

from typing import Optional

import torch

from ..frontend import compile


class AttentionModule(torch.nn.Module):
    """``attngen.compile(score_mod, mask_mod, causal=..., window=..., softcap=..., backend=..., fast_math=...)`` as a
    module: ``forward(q, k, v, scale=None, return_lse=False, q_offset=0)`` calls the compiled variant.

    The variant is compiled in ``__init__``, so the module works under ``torch.compile(fullgraph=True)`` and in CUDA
    graphs, and is differentiable. It has no parameters of its own: a learnable tensor a mod captures (ALiBi slopes,
    a bias table) stays wherever the caller keeps it (e.g. an ``nn.Parameter`` of the parent module), and gets its
    gradient there. ``scale`` given here is the default of every call.

        attn = AttentionModule(score_mod=attngen.softcap(30), causal=True)
        out = attn(q, k, v)          # q (B, Hq, L, D), k/v (B, Hkv, S, D)
    """

    def __init__(self, score_mod=None, mask_mod=None, *, causal: bool = False, window=None,
                 softcap: Optional[float] = None, scale: Optional[float] = None, backend: str = "auto",
                 fast_math: bool = True):
        super().__init__()
        self.attn = compile(score_mod, mask_mod, causal=causal, window=window, softcap=softcap, backend=backend,
                            fast_math=fast_math)
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                return_lse: bool = False, q_offset: int = 0):
        return self.attn(q, k, v, scale=self.scale if scale is None else scale, return_lse=return_lse,
                         q_offset=q_offset)

    def extra_repr(self) -> str:
        return f"{self.attn.name}, scale={self.scale}"
