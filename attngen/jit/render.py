"""Rendering stage: a generated ``variant.inc`` plus a kernel family's template -> the source files of
one library ({filename: text}), self-contained: every header the kernel includes is among them."""
from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Tuple

from ..abi import FP8_DTYPE, FP8_HEAD_DIMS, SUPPORTED_HEAD_DIMS
from ..errors import BuildError
from .tiles import SM90_BWD_TILES, SM90_TILES, bwd_tile_config, decode_tile_config, tile_config
from .toolchain import arch_number

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
KERNEL_SOURCE = "attngen_fwd.cu"
KERNEL_TEMPLATE = "attngen_fwd.cu.j2"  # renders KERNEL_SOURCE: the configuration, then the kernel header
VARIANT_INCLUDE = "variant.inc"
BWD_KERNEL_SOURCE = "attngen_bwd.cu"
BWD_KERNEL_TEMPLATE = "attngen_bwd.cu.j2"  # renders BWD_KERNEL_SOURCE: the configuration, then bwd_<family>.cuh
KERNELS = ("sm80", "sm90", "sm80_bwd", "sm90_bwd")
# The KV-cache kernel (fwd_decode.cuh): a second translation unit of every forward library, rendered from
# KERNEL_TEMPLATE too, so that it shares the library (and its one static CUDA runtime) with the forward kernel.
DECODE_SOURCE = "attngen_decode.cu"

_DTYPES = {
    "float8_e4m3fn": ("attngen::fp8_e4m3", 2, "float8_e4m3fn"),  # the sm90 forward only (bfloat16 output)
    "fp8": ("attngen::fp8_e4m3", 2, "float8_e4m3fn"),
    "bfloat16": ("__nv_bfloat16", 1, "bfloat16"),
    "bf16": ("__nv_bfloat16", 1, "bfloat16"),
    "float16": ("__half", 0, "float16"),
    "fp16": ("__half", 0, "float16"),
    "half": ("__half", 0, "float16"),
}


def dtype_info(dtype) -> Tuple[str, int, str]:
    """(C element type, AttngenKernelInfo.dtype code, name) of a torch dtype or its name."""
    key = str(dtype).replace("torch.", "")
    if key not in _DTYPES:
        raise BuildError(f"dtype {dtype} is not supported by the kernels: expected torch.bfloat16 or torch.float16 "
                         "(or torch.float8_e4m3fn for the sm90 forward)")
    return _DTYPES[key]


@lru_cache(maxsize=None)
def _jinja_env(template_dir: str):
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_dir),
        undefined=jinja2.StrictUndefined,  # a missing parameter is an error, not an empty string
        keep_trailing_newline=True,
        autoescape=False,
    )


def _render(name: str, template_dir: Path = TEMPLATE_DIR, **params) -> str:
    return _jinja_env(str(template_dir)).get_template(name).render(**params)


def headers(template_dir: Path = TEMPLATE_DIR) -> dict:
    """Every device header: plain ``.cuh`` files, and ``.cuh.j2`` ones rendered (headers whose bodies are
    mechanical expansions, e.g. the wgmma operand lists)."""
    out = {}
    for p in sorted(template_dir.glob("*.cuh")):
        out[p.name] = p.read_text()
    for p in sorted(template_dir.glob("*.cuh.j2")):
        out[p.name[: -len(".j2")]] = _render(p.name, template_dir)
    return out


def render_sources(variant_inc: str, dtype, head_dim: int, arch: str, *, tiles=None, kernel: str = "sm80",
                   template_dir: Path = TEMPLATE_DIR) -> dict:
    """Files of one kernel library: {filename: text}. ``kernel``: 'sm80' (portable mma.sync kernel) or
    'sm90' (TMA + wgmma, sm_90a only); ``tiles``: a TileConfig / Sm90Tiles (default: the family's
    default for the head dim). The kernel source (KERNEL_SOURCE) is the configuration rendered from
    KERNEL_TEMPLATE; it includes VARIANT_INCLUDE and the kernel's plain header ``fwd_<kernel>.cuh``,
    which is among the headers returned with them (every ``.cuh``, and the rendered ``.cuh.j2``).
    A forward library also holds the KV-cache kernel, DECODE_SOURCE (``decode_source``).
    'sm80_bwd' / 'sm90_bwd' are backward libraries: BWD_KERNEL_SOURCE rendered from BWD_KERNEL_TEMPLATE
    (``tiles`` a BwdTileConfig / Sm90BwdTiles), including ``bwd_sm80.cuh`` / ``bwd_sm90.cuh``."""
    if kernel not in KERNELS:
        raise BuildError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {list(SUPPORTED_HEAD_DIMS)}")
    elem_type, dtype_code, dtype_name = dtype_info(dtype)
    fp8 = dtype_name == FP8_DTYPE
    if fp8 and (kernel != "sm90" or head_dim not in FP8_HEAD_DIMS):
        raise BuildError(f"FP8 ({FP8_DTYPE}) inputs have the sm90 forward kernel at head dim "
                         f"{' or '.join(map(str, FP8_HEAD_DIMS))} only, got kernel {kernel!r}, head dim {head_dim}; "
                         "use bfloat16 inputs")
    params = dict(kernel=kernel, elem_type=elem_type, out_type="__nv_bfloat16" if fp8 else elem_type,
                  dtype_code=dtype_code, dtype_name=dtype_name, head_dim=head_dim, variant_include=VARIANT_INCLUDE)
    if kernel == "sm80_bwd":
        t = tiles or bwd_tile_config(head_dim, arch)
        params.update(family="sm80", block_q=t.block_q, block_k=t.block_k, num_warps=t.num_warps,
                      warps_d=t.warps_d, min_blocks=t.min_blocks, arch_number=arch_number(arch))
        text = _render(BWD_KERNEL_TEMPLATE, template_dir, **params)
        return {BWD_KERNEL_SOURCE: text, VARIANT_INCLUDE: variant_inc, **headers(template_dir)}
    if kernel == "sm90_bwd":
        if arch != "sm_90a" or head_dim not in SM90_BWD_TILES:
            raise BuildError(f"the sm90 backward needs arch sm_90a and head dim {' or '.join(map(str, SM90_BWD_TILES))}"
                             f", got {arch}, head dim {head_dim}; use kernel='sm80_bwd'")
        t = tiles or SM90_BWD_TILES[head_dim]
        params.update(family="sm90", block_q=t.block_q, block_k=t.block_k, stages=t.stages,
                      producer_regs=t.producer_regs, consumer_regs=t.consumer_regs, walk_shift=t.walk_shift,
                      persistent=int(t.persistent), sections=int(t.sections), order=int(t.order),
                      dq_init=t.dq_init, rel_walk=int(t.rel_walk), rel_stage=int(t.rel_stage), pdl=int(t.pdl),
                      split_probs=int(t.split_probs), dkv_staged=int(t.dkv_staged),
                      s_ahead=t.s_ahead, wait_ns=t.wait_ns,
                      ds_from_packed=int(t.ds_from_packed), ds_stmatrix=int(t.ds_stmatrix),
                      ds_mul_packed=int(t.ds_mul_packed), stats_early=int(t.stats_early),
                      arch_number=90)
        text = _render(BWD_KERNEL_TEMPLATE, template_dir, **params)
        return {BWD_KERNEL_SOURCE: text, VARIANT_INCLUDE: variant_inc, **headers(template_dir)}
    if kernel == "sm90":
        if arch != "sm_90a":
            raise BuildError(f"the sm90 kernel uses wgmma and TMA, which need arch sm_90a (H100/H200), got {arch}; "
                             "use kernel='sm80'")
        t = tiles or SM90_TILES[head_dim]
        params.update(block_q=t.block_q, block_k=t.block_k, stages=t.stages, overlap=t.overlap, pingpong=t.pingpong,
                      pin_softmax=t.pin_softmax, persistent=t.persistent, persistent_max_kv=t.persistent_max_kv,
                      cross_tile=t.cross_tile, o_staged=t.o_staged, rescale_threshold=float(t.rescale_threshold), rel_stage=t.rel_stage,
                      pdl=t.pdl, arch_number=90)
    else:
        t = tiles or tile_config(head_dim, arch)
        params.update(block_q=t.block_q, block_k=t.block_k, num_warps=t.num_warps, min_blocks=t.min_blocks,
                      arch_number=arch_number(arch))
    text = _render(KERNEL_TEMPLATE, template_dir, **params)
    if fp8:  # no KV-cache kernel for FP8 inputs
        return {KERNEL_SOURCE: text, VARIANT_INCLUDE: variant_inc, **headers(template_dir)}
    return {KERNEL_SOURCE: text, DECODE_SOURCE: decode_source(dtype, head_dim, arch, template_dir=template_dir),
            VARIANT_INCLUDE: variant_inc, **headers(template_dir)}


def decode_source(dtype, head_dim: int, arch: str, tiles=None, template_dir: Path = TEMPLATE_DIR) -> str:
    """DECODE_SOURCE of a forward library: the KV-cache kernel's configuration (``tiles`` a DecodeTileConfig,
    default jit.tiles.decode_tile_config) and fwd_decode.cuh, compiled as a second unit beside the forward's."""
    elem_type, dtype_code, dtype_name = dtype_info(dtype)
    t = tiles or decode_tile_config(head_dim, arch)
    return _render(KERNEL_TEMPLATE, template_dir, kernel="decode", elem_type=elem_type, out_type=elem_type,
                   dtype_code=dtype_code, dtype_name=dtype_name, head_dim=head_dim, variant_include=VARIANT_INCLUDE,
                   block_q=t.block_q, block_k=t.block_k, num_warps=t.num_warps, stages=t.stages, min_blocks=t.min_blocks,
                   pdl=t.pdl, arch_number=arch_number(arch))


# The Python that turns a traced variant into a binary besides the templates: its derivation, printing and build
# flags. Part of cache keys, so that a change to any of them (not only to a template) rebuilds.
GENERATOR_SOURCES = ("trace.py", "predicates.py", "summaries.py", "symbols.py", "ir.py", "mods.py", "codegen.py",
                     "printer.py", "gradients.py", "jit/render.py", "jit/ninja.py", "jit/tiles.py", "abi.py")


@lru_cache(maxsize=None)
def generator_hash() -> str:
    """sha256 over GENERATOR_SOURCES (names and contents), once per process: part of cache keys."""
    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for name in GENERATOR_SOURCES:
        h.update(name.encode() + b"\0")
        h.update((pkg / name).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


@lru_cache(maxsize=None)
def template_hash(template_dir: Path = TEMPLATE_DIR) -> str:
    """sha256 over every file under the template folder (names and contents): part of cache keys."""
    h = hashlib.sha256()
    for path in sorted(p for p in template_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(template_dir).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()
