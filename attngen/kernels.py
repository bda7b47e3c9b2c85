"""Kernel stage: variant -> generated sources -> ninja/nvcc -> cached library -> launch.

One library per signature (variant canonical text, dtype, head dim, arch, template, flags), built
once into the on-disk cache (attngen/cache) and memoised in process, so a call after the first costs
a dict lookup plus the ctypes launch.
"""
from __future__ import annotations

import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import torch

from . import __version__
from .build import (
    LIBRARY_NAME,
    SM90_FALLBACK_CODES,
    SM90_LADDER,
    SM90_TILES,
    SUPPORTED_HEAD_DIMS,
    current_arch,
    find_nvcc,
    nvcc_version,
    render_sources,
    run_ninja,
    sm90_ladder,
    template_hash,
    tile_config,
    write_build_ninja,
)
from .cache import default_cache
from .codegen import render_variant_inc
from .errors import InputError
from .runtime import KernelLaunchError, forward, load_library

_LOCK = threading.Lock()
_TEMPLATE_HASH: Optional[str] = None


def _template_hash() -> str:
    global _TEMPLATE_HASH
    if _TEMPLATE_HASH is None:
        _TEMPLATE_HASH = template_hash()
    return _TEMPLATE_HASH


# 'auto' picks the SM90 (TMA + wgmma) template on sm_90a: it passed the whole GPU API suite on the H200
# (benchmarks/results/2026-11-29-h200-sm90/). backend='sm80' keeps the portable kernel.
SM90_BY_DEFAULT = True


def choose_kernel(arch: str, kernel: str = "auto") -> str:
    """'sm90' (TMA + wgmma) or the portable 'sm80' kernel for an arch."""
    if kernel not in ("auto", "sm80", "sm90"):
        raise InputError(f"kernel must be 'auto', 'sm80' or 'sm90', got {kernel!r}")
    if kernel == "sm90":
        if arch != "sm_90a":
            raise InputError(f"the sm90 kernel needs arch sm_90a (H100/H200), got {arch}; use backend='sm80'")
        return "sm90"
    if kernel == "auto" and arch == "sm_90a" and SM90_BY_DEFAULT:
        return "sm90"
    return "sm80"


def signature_fields(attn, dtype: torch.dtype, head_dim: int, arch: str, kernel: str) -> dict:
    traced = attn.traced
    return {
        "variant": traced.canonical(),
        "summaries": [s.key for s in attn.predicates.summaries],
        "dtype": str(dtype),
        "head_dim": head_dim,
        "arch": arch,
        "kernel": kernel,
        # tile settings live in build.py, not in the templates: they change the binary too (with
        # SM90_SPILL_LADDER the whole ladder, since the build takes its first rung that does not spill)
        "tiles": repr(_sm90_tile_choices(head_dim, traced.has_mask, traced.has_score_mod) if kernel == "sm90"
                      else tile_config(head_dim, arch)),
        "fast_math": attn.fast_math,
        "templates": _template_hash(),
        "attngen": __version__,
        "nvcc": list(nvcc_version()),
    }


def _readable_name(attn, dtype, head_dim, arch, kernel) -> str:
    dt = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))
    return f"{attn.variant.name} {dt} hd{head_dim} {arch} {kernel}"


def build_kernel(attn, dtype: torch.dtype = torch.bfloat16, head_dim: int = 128, arch: Optional[str] = None,
                 kernel: str = "auto") -> Path:
    """Build (or find in the cache) the library for one signature; needs nvcc, not a GPU."""
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise InputError(f"head dim {head_dim} is not supported: expected one of {list(SUPPORTED_HEAD_DIMS)}")
    if dtype not in (torch.bfloat16, torch.float16):
        raise InputError(f"the kernels take torch.bfloat16 or torch.float16, got {dtype}")
    arch = arch or current_arch()
    kind = choose_kernel(arch, kernel)
    fields = signature_fields(attn, dtype, head_dim, arch, kind)
    from .cache import cache_key

    key = cache_key(fields)
    name = _readable_name(attn, dtype, head_dim, arch, kind)

    def build(tmpdir: Path) -> dict:
        t0 = time.perf_counter()
        inc = render_variant_inc(attn.traced, attn.predicates, fast_tanh=attn.fast_math, fast_exp2=attn.fast_math)
        info = {}
        if kind == "sm90" and SM90_SPILL_LADDER:
            tiles, spill = build_sm90_ladder(tmpdir, inc, dtype, head_dim, arch,
                                             ladder=sm90_ladder(head_dim, attn.traced.has_mask,
                                                                attn.traced.has_score_mod))
            info = {"tiles": repr(tiles), "spill_bytes": spill}
        else:
            write_build_ninja(tmpdir, render_sources(inc, dtype, head_dim, arch, kernel=kind), arch)
            run_ninja(tmpdir)
        for p in tmpdir.glob("*.o"):
            p.unlink()
        for p in tmpdir.glob("*.o.d"):
            p.unlink()
        return {"compiler": find_nvcc(), "build_seconds": round(time.perf_counter() - t0, 3), **info}

    meta = {
        "fields": fields,
        "expressions": {
            "score": str(attn.traced.score),
            "mask": str(attn.traced.mask),
            "kv_range": [str(attn.predicates.kv_lo), str(attn.predicates.kv_hi)],
        },
    }
    return default_cache().get_or_build(key, name, build, meta=meta, artifact=LIBRARY_NAME)


# Build SM90 kernels with the first SM90_LADDER rung that does not spill, instead of SM90_TILES always:
# variants whose mods keep many values live (a bias table, key padding over documents, two document
# masks) would otherwise spill registers to local memory in the main loop.
SM90_SPILL_LADDER = True


def _sm90_tile_choices(head_dim: int, has_mask: bool, has_score_mod: bool):
    return sm90_ladder(head_dim, has_mask, has_score_mod) if SM90_SPILL_LADDER else SM90_TILES[head_dim]


def ptxas_spill_bytes(output: str) -> Optional[int]:
    """Spill store + load bytes in `-Xptxas -v` output (one kernel per library); None without a report."""
    found = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", output)
    return sum(int(a) + int(b) for a, b in found) if found else None


def build_sm90_ladder(build_dir: Path, variant_inc: str, dtype, head_dim: int, arch: str, ladder=None):
    """Build the SM90 library in build_dir with the first rung of ``ladder`` (default SM90_LADDER[head_dim])
    that ptxas compiles without spilling (mods that keep many values live push the default tiles over the
    register budget); when every rung spills, the one that spills least. Returns (tiles, spill bytes).

    The first rung is built alone (most variants stop there); when it spills, the other rungs build at
    once, one nvcc each in its own subdirectory, so a heavy mod costs about two builds of wall time, not
    one per rung, and the chosen rung's files replace the first rung's."""
    ladder = tuple(ladder or SM90_LADDER[head_dim])
    build_dir = Path(build_dir)

    def build_in(d: Path, tiles) -> int:
        sources = render_sources(variant_inc, dtype, head_dim, arch, tiles=tiles, kernel="sm90")
        write_build_ninja(d, sources, arch, ["-Xptxas", "-v"])
        return ptxas_spill_bytes(run_ninja(d)) or 0

    spill = build_in(build_dir, ladder[0])
    if spill == 0 or len(ladder) == 1:
        return ladder[0], spill
    dirs = [build_dir / f"rung{n}" for n in range(1, len(ladder))]
    try:
        with ThreadPoolExecutor(len(dirs)) as ex:
            spills = list(ex.map(build_in, dirs, ladder[1:]))
        results = [(spill, ladder[0], build_dir)] + list(zip(spills, ladder[1:], dirs))
        spill, tiles, chosen = next((r for r in results if r[0] == 0), None) or min(results, key=lambda r: r[0])
        if chosen != build_dir:
            for f in chosen.iterdir():  # sources, build.ninja (relative paths), the library
                if f.is_file() and not f.name.startswith("."):
                    shutil.copy2(f, build_dir / f.name)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    return tiles, spill


def _library(attn, dtype, head_dim, device_index: int, kernel: Optional[str] = None):
    """The loaded library of one signature, memoised on the compiled object itself (a dict lookup per
    call; no global table keyed by object ids, which Python reuses)."""
    default = kernel is None
    kernel = kernel or (attn.backend if attn.backend in ("sm80", "sm90") else "auto")
    key = (dtype, head_dim, device_index, kernel)
    libs = attn._kernels
    lib = libs.get(key)
    if lib is None:
        with _LOCK:
            lib = libs.get(key)
            if lib is None:
                path = build_kernel(attn, dtype, head_dim, current_arch(device_index), kernel)
                lib = load_library(path)
                libs[key] = lib
    if default and not attn.traced.captured and not attn.predicates.summaries and attn.backend != "reference":
        # CompiledAttention.__call__ launches it straight through runtime.forward from now on
        ready = getattr(attn, "_ready", None)
        if ready is not None:
            ready[(dtype, head_dim, device_index)] = lib
    return lib


class _SummaryCache:
    """Per-block summaries of captured tensors, recomputed only when a tensor or a length changes
    (keyed by data pointer and torch's in-place version counter)."""

    def __init__(self):
        self.key = None
        self.value = ()

    def get(self, attn, captured, lib, Lq, Lk, q_offset):
        preds = attn.predicates
        if not preds.summaries:
            return ()
        key = (lib.block_q, lib.block_k, Lq, Lk, q_offset,
               tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in captured))
        if key != self.key:
            tensors = {c.name: t for c, t in zip(attn.traced.captured, captured)}
            self.value = tuple(s.compute(tensors, lib.block_q, lib.block_k, Lq, Lk, q_offset) for s in preds.summaries)
            self.key = key
        return self.value


def run_forward(attn, q, k, v, *, scale=None, return_lse=False, q_offset=0, kernel=None):
    if q.dim() != 4:
        raise InputError(f"q must have shape (B, H, L, D), got {tuple(q.shape)}")
    head_dim = q.shape[-1]
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    lib = _library(attn, q.dtype, head_dim, dev, kernel)
    try:
        return _launch(attn, lib, q, k, v, scale, return_lse, q_offset)
    except KernelLaunchError as e:
        if e.code not in SM90_FALLBACK_CODES:
            raise
        # the layout cannot be described by a TMA tensor map (or no driver support): portable kernel
        return _launch(attn, _library(attn, q.dtype, head_dim, dev, "sm80"), q, k, v, scale, return_lse, q_offset)


def _launch(attn, lib, q, k, v, scale, return_lse, q_offset):
    captured = [c.tensor for c in attn.traced.captured]
    for c, t in zip(attn.traced.captured, captured):
        if t.device != q.device:
            raise InputError(
                f"captured tensor {c.name} ({t.dtype}, shape {tuple(t.shape)}) is on {t.device} but q is on {q.device}; "
                f"move it before compiling (e.g. doc_ids.to('{q.device}'))"
            )
        for d in c.unit_stride_dims:
            if t.stride(d) != 1 and t.shape[d] > 1:
                raise InputError(
                    f"captured tensor {c.name} ({t.dtype}, shape {tuple(t.shape)}) had stride 1 in dim {d} when the "
                    f"variant was compiled, and the kernel was built for it; now its strides are {tuple(t.stride())}. "
                    "Keep the captured tensor's layout (copy new values in with .copy_()), or compile the variant again"
                )
    sc = attn.__dict__.setdefault("_summary_cache", _SummaryCache())
    summaries = sc.get(attn, captured, lib, q.shape[2], k.shape[2], int(q_offset))
    return forward(lib, q, k, v, scale=scale, q_offset=int(q_offset), return_lse=return_lse,
                   captured=captured, summaries=summaries)
