"""Temporary shim (removed once every caller uses jit.spec / CompiledAttention)."""
from .jit.ninja import ptxas_spill_bytes  # noqa: F401
from .jit.spec import build_first_without_spills as _bfws, choose_kernel  # noqa: F401
from .jit.tiles import SM90_LADDER


def build_kernel(attn, dtype=None, head_dim=128, arch=None, kernel="auto"):
    import torch
    return attn.spec(dtype or torch.bfloat16, head_dim, arch, kernel).build_cached()


def build_sm90_ladder(build_dir, variant_inc, dtype, head_dim, arch, ladder=None):
    return _bfws(build_dir, variant_inc, dtype, head_dim, arch, ladder or SM90_LADDER[head_dim])


def run_forward(attn, q, k, v, *, scale=None, return_lse=False, q_offset=0, kernel=None):
    dev = q.device.index
    lib = attn.library(q.dtype, q.shape[-1], dev, kernel)
    return attn._run(lib, q, k, v, scale, return_lse, q_offset)
