"""Build stage: render the kernel template around a generated ``variant.inc`` and compile it with
nvcc through ninja into a shared library exporting the C ABI of ``attngen_common.cuh``.

    sources = render_sources(variant_inc, torch.bfloat16, 128, "sm_90a")
    so_path = write_build_ninja(build_dir, sources, "sm_90a")
    run_ninja(build_dir)

Tile sizes (``tile_config``): rows padded by 16 bytes in shared memory, K/V double-buffered (2
stages), BQ/(16*warps) m16 row tiles per warp. Picked by measurement on an H200 (bf16, B=4, H=16,
L=4096, full / causal, TFLOP/s; registers from ptxas, no spills):

    head dim  BQ x BK, warps   smem       H200 full / causal   alternatives measured (full)
    64        128 x 64, 4      55,296 B   301 / 255 TF, 209 r  64x64/4: 248; 128x64/8: 216; 128x128/8: 229
    128       128 x 32, 4      69,632 B   324 / 278 TF, 237 r  64x64/4: 259; 128x64/8: 245; 64x128/4: 203;
                                                               128x64/4 spills (255 r)
    256       128 x 64, 8      202,752 B  279 / 252 TF, 234 r  64x32/4: 220; 64x64/4: 209; 128x32/8: 241
    256 sm8x  64 x 32, 4       101,376 B  (fits the 99 KB of sm86/sm89 and the 163 KB of sm80)

Two m16 tiles per warp (BQ = 32 x warps) halve the shared-memory traffic per mma; BK = 32 at hd128
keeps S small enough for that to fit in 255 registers.
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Tuple, Union

from .errors import BuildError

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
SUPPORTED_HEAD_DIMS = (64, 128, 256)
# Headers the kernel source includes; copied next to it so a build directory is self-contained.
KERNEL_HEADERS = ("attngen_common.cuh", "sm80_mma.cuh", "sm80_copy.cuh")
KERNEL_SOURCE = "attngen_fwd.cu"
VARIANT_INCLUDE = "variant.inc"
LIBRARY_NAME = "libattngen_fwd.so"

_NVCC_HELP = (
    "attngen compiles attention kernels at run time and needs CUDA's compiler, nvcc (CUDA 12.0 or newer). "
    "Install it with `pip install attngen[jit]` (the nvidia-cuda-nvcc package), or install the CUDA "
    "toolkit and put its bin/ on PATH or set CUDA_HOME to the toolkit's directory"
)


from .cache import verbose as _verbose  # noqa: E402  (one definition of ATTNGEN_VERBOSE)
from .cache import write_if_different  # noqa: E402  (generated files: ninja sees only real changes)


# --------------------------------------------------------------------------------------------------
# nvcc discovery


def _pip_nvcc_candidates() -> list:
    """nvcc shipped by the nvidia-cuda-nvcc wheel: nvidia/cu13/bin/nvcc (CUDA 13 wheels) or
    nvidia/cuda_nvcc/bin/nvcc (CUDA 12 wheels), inside the `nvidia` namespace package."""
    try:
        import nvidia  # type: ignore
    except ImportError:
        return []
    found = []
    for root in list(getattr(nvidia, "__path__", [])):
        found.extend(sorted(glob.glob(os.path.join(root, "*", "bin", "nvcc")), reverse=True))
    return found


def find_nvcc() -> str:
    """Path of nvcc: $ATTNGEN_NVCC, then PATH, then $CUDA_HOME/bin ($CUDA_PATH/bin), then the
    nvidia-cuda-nvcc PyPI package. Raises BuildError saying how to get one."""
    candidates = []
    if os.environ.get("ATTNGEN_NVCC"):
        candidates.append(os.environ["ATTNGEN_NVCC"])
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(on_path)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc"))
    candidates.extend(_pip_nvcc_candidates())
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.abspath(c)
    searched = ", ".join(candidates) if candidates else "nothing found on PATH, CUDA_HOME, CUDA_PATH or pip"
    raise BuildError(f"nvcc not found ({searched}). {_NVCC_HELP}.")


def nvcc_available() -> bool:
    """Whether find_nvcc() would find a compiler (kernels can be built here)."""
    try:
        find_nvcc()
        return True
    except BuildError:
        return False


@lru_cache(maxsize=None)
def _nvcc_version_of(nvcc: str) -> Tuple[int, int]:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"could not run {nvcc} --version: {e}. {_NVCC_HELP}.") from e
    m = re.search(r"release (\d+)\.(\d+)", out.stdout + out.stderr)
    if out.returncode != 0 or not m:
        raise BuildError(
            f"{nvcc} --version failed (exit {out.returncode}):\n{out.stdout}{out.stderr}\n{_NVCC_HELP}."
        )
    return int(m.group(1)), int(m.group(2))


def nvcc_version(nvcc: Optional[str] = None) -> Tuple[int, int]:
    """(major, minor) of nvcc, e.g. (13, 0). Part of every cache key, so it is needed on warm loads
    too: remembered on disk per (real path, mtime, size) of the binary, so a fresh process loading
    a cached kernel does not spawn nvcc (tens of ms)."""
    return _nvcc_version_memo(nvcc or find_nvcc())


@lru_cache(maxsize=None)
def _nvcc_version_memo(nvcc: str) -> Tuple[int, int]:
    import json

    from .cache import default_cache

    real = os.path.realpath(nvcc)
    st = os.stat(real)
    tag = f"{real}|{st.st_mtime_ns}|{st.st_size}"
    try:
        memo = default_cache().root / "nvcc-versions.json"
        data = json.loads(memo.read_text()) if memo.exists() else {}
    except (OSError, ValueError, AttributeError):
        memo, data = None, {}
    v = data.get(tag)
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return v[0], v[1]
    v = _nvcc_version_of(nvcc)
    if memo is not None:
        data[tag] = list(v)
        try:
            write_if_different(memo, json.dumps(data, sort_keys=True))
        except OSError:
            pass  # a read-only cache only costs the subprocess next time
    return v


# --------------------------------------------------------------------------------------------------
# architectures

_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


def _parse_arch(arch: str) -> Tuple[int, str]:
    m = _ARCH_RE.match(arch)
    if not m:
        raise BuildError(f"unknown GPU architecture {arch!r}: expected 'sm_80', 'sm_86', 'sm_90a', ...")
    return int(m.group(1)), m.group(2)


def arch_flags(arch: str) -> list:
    """nvcc flags generating machine code for `arch` ('sm_80', 'sm_90a', ...). Always the explicit
    -gencode form: `-arch=sm_90a` is reported to also run a plain sm_90 pass on nvcc 13."""
    num, suffix = _parse_arch(arch)
    return [f"-gencode=arch=compute_{num}{suffix},code=sm_{num}{suffix}"]


def current_arch(device=None) -> str:
    """Architecture of a CUDA device (default: the current one): (9, 0) -> 'sm_90a', (8, 0) -> 'sm_80'."""
    import torch

    if not torch.cuda.is_available():
        raise BuildError("no CUDA device is visible to torch, so the GPU architecture is unknown; pass arch='sm_80' "
                         "(or 'sm_90a', ...) explicitly to build without a GPU")
    major, minor = torch.cuda.get_device_capability(device)
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def _arch_number(arch: str) -> int:
    return _parse_arch(arch)[0]


# --------------------------------------------------------------------------------------------------
# rendering


@dataclass(frozen=True)
class TileConfig:
    block_q: int
    block_k: int
    num_warps: int = 4
    min_blocks: int = 1

    def smem_bytes(self, head_dim: int) -> int:
        pitch = (head_dim + 8) * 2
        return (self.block_q + 4 * self.block_k) * pitch


# Preference order per head dim; the first that fits the arch's shared memory per block is used.
_TILES = {
    64: (TileConfig(block_q=128, block_k=64, num_warps=4),),
    128: (TileConfig(block_q=128, block_k=32, num_warps=4),),
    256: (TileConfig(block_q=128, block_k=64, num_warps=8), TileConfig(block_q=64, block_k=32, num_warps=4)),
}
# Opt-in shared memory per block (bytes) by compute capability number; unknown archs get the smallest.
_SMEM_PER_BLOCK = {80: 166912, 87: 166912, 90: 232448, 100: 232448, 103: 232448}
_SMEM_DEFAULT = 101376  # sm86, sm89, sm120, ...


def tile_config(head_dim: int, arch: str = "sm_80") -> TileConfig:
    """Tile sizes for a head dim on an arch (see the module docstring)."""
    num, _ = _parse_arch(arch)
    if head_dim not in _TILES:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {SUPPORTED_HEAD_DIMS}")
    limit = _SMEM_PER_BLOCK.get(num, _SMEM_DEFAULT)
    for cfg in _TILES[head_dim]:
        if cfg.smem_bytes(head_dim) <= limit:
            return cfg
    raise BuildError(f"no tile configuration for head dim {head_dim} fits the {limit} bytes of shared memory of {arch}")


_DTYPES = {
    "bfloat16": ("__nv_bfloat16", 1, "bfloat16"),
    "bf16": ("__nv_bfloat16", 1, "bfloat16"),
    "float16": ("__half", 0, "float16"),
    "fp16": ("__half", 0, "float16"),
    "half": ("__half", 0, "float16"),
}


def _dtype_info(dtype) -> Tuple[str, int, str]:
    key = str(dtype).replace("torch.", "")
    if key not in _DTYPES:
        raise BuildError(f"dtype {dtype} is not supported by the kernels: expected torch.bfloat16 or torch.float16")
    return _DTYPES[key]


@lru_cache(maxsize=None)
def _jinja_env():
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,  # a missing parameter is an error, not an empty string
        keep_trailing_newline=True,
        autoescape=False,
    )


@dataclass(frozen=True)
class Sm90Tiles:
    """Tiles of the SM90 (TMA + wgmma) kernel. BQ is always 128: two consumer warpgroups x 64 rows."""

    block_k: int
    stages: int
    overlap: bool = True  # issue the next Q.K^T before this tile's softmax (intra-warpgroup overlap)
    pingpong: bool = True  # alternate softmax and GEMMs between the two consumer warpgroups
    # grid = number of SMs, each CTA takes work tiles from a global counter (sm90_tile_counter.cuh);
    # sm90_ladder turns it on for plain attention
    persistent: bool = False
    # > 0: keep a row's running max while it grows by at most this (log2 units) and skip rescaling O
    # (FA4's conditional rescale); the defaults below use 8
    rescale_threshold: float = 0.0
    # of every 8 exponentials of a row, how many run as an FMA-pipe polynomial instead of on MUFU
    # (for MUFU-bound mods such as softcap's tanh); measured slower on the H200 (2 of 8: full -7%,
    # softcap -1%; 3 of 8 with fold_log2e: softcap -6%), so 0
    poly_exp2: int = 0
    # score_mod variants: log2(e) folded into the exponent's FFMA; measured only with poly_exp2, so off
    fold_log2e: bool = False
    block_q: int = 128

    def smem_bytes(self, head_dim: int) -> int:
        """Dynamic shared memory: 1 KiB alignment slack, the Q tile, the K/V ring, mbarriers, the tile id."""
        q = self.block_q * head_dim * 2
        kv = self.block_k * head_dim * 2
        return 1024 + q + 2 * self.stages * kv + 8 * (2 + 4 * self.stages + 2) + 8


# Defaults per head dim (BK=128 at d64/d128 as FA3; d256 is bounded by the 227 KiB of shared memory).
# rescale_threshold 8 (FA4's conditional rescale): 2-4% faster on the masked and score_mod anchors of the
# H200, neutral on full (benchmarks/results/2026-11-29-h200-sm90-r3/tiles-hd128.log, tiles-hd64-hd256.log).
_RT = 8.0
SM90_TILES = {64: Sm90Tiles(128, 3, rescale_threshold=_RT), 128: Sm90Tiles(128, 2, rescale_threshold=_RT),
              256: Sm90Tiles(80, 2, rescale_threshold=_RT)}
# Variants without a mask: wider K/V tiles (FA3's choice for hd128 without causal/local), fewer and longer
# loop iterations; full +3.5% at hd128, +2.8% at hd64 (same logs). With a mask, 128 lines K/V tiles up with the
# 128-row q-blocks: the sliding window lost 7% at 176. Used through the spill ladder (softcap spills at 176).
SM90_WIDE = {64: Sm90Tiles(176, 3, rescale_threshold=_RT), 128: Sm90Tiles(176, 2, rescale_threshold=_RT)}
# Lighter configurations, in order of preference, for variants whose mods keep many values live
# (ptxas is not monotonic here: a smaller BK can spill more); each was measured spill-free on the
# heavier fixtures (tests/test_build_sm90.py).
SM90_LADDER = {
    64: (SM90_TILES[64], Sm90Tiles(96, 3, rescale_threshold=_RT), Sm90Tiles(64, 4, overlap=False, rescale_threshold=_RT)),
    128: (SM90_TILES[128], Sm90Tiles(112, 2, rescale_threshold=_RT), Sm90Tiles(96, 2, rescale_threshold=_RT),
          Sm90Tiles(64, 2, overlap=False, rescale_threshold=_RT)),
    # (64, 2) with overlap spills 4 B on the alibi + document fixture since the persistent tile loop
    256: (SM90_TILES[256], Sm90Tiles(64, 2, overlap=False, rescale_threshold=_RT)),
}


def sm90_ladder(head_dim: int, has_mask: bool, has_score_mod: bool) -> tuple:
    """The tile settings a variant's SM90 build tries, best first (kernels.build_sm90_ladder takes the
    first that ptxas compiles without spills).

    Without a mask the ladder starts at the wide tiles (SM90_WIDE). Plain attention (no mask, no
    score_mod) runs on the persistent grid, whose CTAs take work tiles from a global counter and load a
    tile's Q and K/V under the previous tile's epilogue (full at S = 1024: +8% at hd128 already with the
    earlier static deal). For the other variants it did not measure a clear gain over one CTA per tile
    (H200, B=2 H=16 S=8192 D=128, two rounds side by side, benchmarks/results/2026-11-29-h200-sm90-r4/
    tiles-round3.log and tiles-round4.log): sliding window +4.3% / +3.5%, but causal +1.2% / -2.5%,
    document ids +4.0% / -2.1%, prefix-LM +0.4% / -2.0%, softcap 0% / -2.1%, softcap + causal -2.5% / -1.7%,
    ALiBi + causal +1.9% / -0.5%."""
    if has_mask:
        return SM90_LADDER[head_dim]
    wide = SM90_WIDE.get(head_dim)
    ladder = ((wide,) if wide is not None else ()) + SM90_LADDER[head_dim]
    return ladder if has_score_mod else tuple(replace(t, persistent=True) for t in ladder)


SM90_HEADERS = ("attngen_common.cuh", "sm80_mma.cuh", "fast_math.cuh", "sm90_mbarrier.cuh", "sm90_tma.cuh",
                "sm90_wgmma.cuh", "sm90_tile_counter.cuh")
# attngen_fwd's own return codes when a TMA tensor map cannot be made: run the sm80 kernel instead
SM90_FALLBACK_CODES = (9001, 9002)


def render_sources(variant_inc: str, dtype, head_dim: int, arch: str, *, tiles=None, kernel: str = "sm80") -> dict:
    """Files of one kernel library: {filename: text}. The kernel source includes `variant.inc` and the
    headers it needs, all returned here, so a build directory holding them is self-contained.
    ``kernel``: 'sm80' (portable mma.sync kernel) or 'sm90' (TMA + wgmma, sm_90a only)."""
    if kernel == "sm90":
        return _render_sm90(variant_inc, dtype, head_dim, arch, tiles)
    if kernel != "sm80":
        raise BuildError(f"kernel must be 'sm80' or 'sm90', got {kernel!r}")
    elem_type, dtype_code, dtype_name = _dtype_info(dtype)
    tiles = tiles or tile_config(head_dim, arch)
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {SUPPORTED_HEAD_DIMS}")
    template = _jinja_env().get_template("fwd_sm80.cu.j2")
    kernel = template.render(
        elem_type=elem_type,
        dtype_code=dtype_code,
        dtype_name=dtype_name,
        head_dim=head_dim,
        block_q=tiles.block_q,
        block_k=tiles.block_k,
        num_warps=tiles.num_warps,
        min_blocks=tiles.min_blocks,
        arch_number=_arch_number(arch),
        variant_include=VARIANT_INCLUDE,
    )
    sources = {KERNEL_SOURCE: kernel, VARIANT_INCLUDE: variant_inc}
    for name in KERNEL_HEADERS:
        sources[name] = (TEMPLATE_DIR / name).read_text()
    return sources


def _render_sm90(variant_inc: str, dtype, head_dim: int, arch: str, tiles) -> dict:
    if arch != "sm_90a":
        raise BuildError(f"the sm90 kernel uses wgmma and TMA, which need arch sm_90a (H100/H200), got {arch}; "
                         "use kernel='sm80'")
    if head_dim not in SM90_TILES:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {sorted(SM90_TILES)}")
    elem_type, dtype_code, dtype_name = _dtype_info(dtype)
    tiles = tiles or SM90_TILES[head_dim]
    kernel = _jinja_env().get_template("fwd_sm90.cu.j2").render(
        elem_type=elem_type, dtype_code=dtype_code, dtype_name=dtype_name, head_dim=head_dim,
        block_q=tiles.block_q, block_k=tiles.block_k, stages=tiles.stages, overlap=tiles.overlap,
        pingpong=tiles.pingpong, persistent=tiles.persistent, rescale_threshold=float(tiles.rescale_threshold),
        poly_exp2=tiles.poly_exp2, fold_log2e=tiles.fold_log2e, arch_number=90, variant_include=VARIANT_INCLUDE,
    )
    sources = {KERNEL_SOURCE: kernel, VARIANT_INCLUDE: variant_inc}
    for name in SM90_HEADERS:
        sources[name] = _header_text(name)
    return sources


def _header_text(name: str) -> str:
    """A device header: plain file, or rendered from `<name>.j2` (headers whose bodies are mechanical
    expansions, e.g. the wgmma operand lists, are written as Jinja loops)."""
    if (TEMPLATE_DIR / (name + ".j2")).exists():
        return _jinja_env().get_template(name + ".j2").render()
    return (TEMPLATE_DIR / name).read_text()


def template_hash() -> str:
    """sha256 over every file under attngen/templates (names and contents): part of cache keys."""
    h = hashlib.sha256()
    for path in sorted(p for p in TEMPLATE_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(TEMPLATE_DIR).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------------------------------
# ninja

BASE_FLAGS = ("-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden", "-lineinfo")
# Static cudart (nvcc's default, named for clarity), never -lcuda: libcuda is found by cudart at
# run time. --exclude-libs keeps cudart's symbols out of the library's dynamic symbol table.
LINK_FLAGS = ("-shared", "-cudart", "static", "-Xlinker", "--exclude-libs,ALL")


def _ninja_escape(s: str) -> str:
    return s.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _shell_quote(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def write_build_ninja(
    build_dir: Union[str, Path],
    sources: Union[Mapping[str, str], Iterable[str]],
    arch: str,
    flags: Sequence[str] = (),
    *,
    nvcc: Optional[str] = None,
    library: str = LIBRARY_NAME,
) -> list:
    """Write `sources` ({relative path: text}, or names of files already in build_dir) and a
    build.ninja compiling every .cu into a .o and linking the objects of each directory into
    `<dir>/<library>`. Several variants can share one build.ninja (and so one `ninja -jN`) by
    living in subdirectories, each with its own kernel source and variant.inc; headers in the top
    directory are found through -I. Returns the library paths (one per directory holding a .cu)."""
    build_dir = Path(build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    if isinstance(sources, Mapping):
        for name, text in sources.items():
            write_if_different(build_dir / name, text)
        names = list(sources)
    else:
        names = list(sources)
    cu = sorted(n for n in names if n.endswith(".cu"))
    if not cu:
        raise BuildError(f"no .cu source among {names}: nothing to compile in {build_dir}")
    nvcc = nvcc or find_nvcc()
    arch_f = arch_flags(arch)
    cflags = [*BASE_FLAGS, *arch_f, "-I.", *flags]

    lines = [
        "# Generated by attngen/build.py",
        "ninja_required_version = 1.3",
        f"nvcc = {_ninja_escape(_shell_quote(nvcc))}",
        f"cflags = {' '.join(_shell_quote(f) for f in cflags)}",
        f"ldflags = {' '.join(_shell_quote(f) for f in (*LINK_FLAGS, *arch_f))}",
        "",
        "rule nvcc_compile",
        # -MD -MF: header dependencies, so editing variant.inc or a header rebuilds the object
        "  command = $nvcc $cflags -MD -MF $out.d -c $in -o $out",
        "  depfile = $out.d",
        "  deps = gcc",
        "  description = NVCC $out",
        "",
        "rule nvcc_link",
        "  command = $nvcc $ldflags $in -o $out",
        "  description = LINK $out",
        "",
    ]
    by_dir: dict = {}
    for name in cu:
        obj = name[: -len(".cu")] + ".o"
        lines.append(f"build {_ninja_escape(obj)}: nvcc_compile {_ninja_escape(name)}")
        by_dir.setdefault(os.path.dirname(name), []).append(obj)
    libs = []
    for d, objs in sorted(by_dir.items()):
        lib = os.path.join(d, library) if d else library
        lines.append(f"build {_ninja_escape(lib)}: nvcc_link {' '.join(_ninja_escape(o) for o in objs)}")
        libs.append(str(build_dir / lib))
    lines += ["", f"default {' '.join(_ninja_escape(os.path.relpath(l, build_dir)) for l in libs)}", ""]
    write_if_different(build_dir / "build.ninja", "\n".join(lines))
    return libs


def _ninja_binary() -> str:
    exe = shutil.which("ninja")
    if exe:
        return exe
    try:
        import ninja  # type: ignore

        cand = os.path.join(ninja.BIN_DIR, "ninja")
        if os.path.isfile(cand):
            return cand
    except ImportError:
        pass
    raise BuildError("ninja not found: `pip install ninja` (a dependency of attngen)")


def run_ninja(build_dir: Union[str, Path], jobs: Optional[int] = None, targets: Sequence[str] = ()) -> str:
    """Run ninja in build_dir; returns its output (compiler messages, e.g. -Xptxas -v reports).
    Raises BuildError carrying ninja's and nvcc's output on failure. ATTNGEN_VERBOSE=1 prints the
    command lines and the output."""
    cmd = [_ninja_binary(), "-C", str(build_dir)]
    if jobs:
        cmd += ["-j", str(jobs)]
    if _verbose():
        cmd.append("-v")
    cmd += list(targets)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise BuildError(f"could not run ninja ({' '.join(cmd)}): {e}") from e
    out = proc.stdout + proc.stderr
    if _verbose():
        print(out, file=sys.stderr, end="" if out.endswith("\n") else "\n")
    if proc.returncode != 0:
        raise BuildError(
            f"compiling the attention kernel failed in {build_dir} (ninja exit {proc.returncode}). "
            f"Compiler output:\n{out}\nRe-run with ATTNGEN_VERBOSE=1 to see the command lines."
        )
    return out


def build_library(
    variant_inc: str,
    dtype,
    head_dim: int,
    arch: str,
    build_dir: Union[str, Path],
    flags: Sequence[str] = (),
    jobs: Optional[int] = None,
) -> str:
    """render_sources + write_build_ninja + run_ninja for one variant; returns the library path."""
    sources = render_sources(variant_inc, dtype, head_dim, arch)
    (lib,) = write_build_ninja(build_dir, sources, arch, flags)
    run_ninja(build_dir, jobs=jobs)
    return lib
