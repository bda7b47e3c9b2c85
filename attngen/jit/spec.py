"""Kernel spec: one library's signature, its readable name and cache key, and how to build it.

    spec = KernelSpec.create(traced, predicates, name="causal", dtype=torch.bfloat16, head_dim=128,
                             arch="sm_90a")
    path = spec.build_cached()          # the cache's library path; built (spill ladder) on a miss

The spec is everything that changes the binary; the cache stores one library per spec key. Its key needs
only the variant's ``VariantFacts`` (sympy-free); the traced variant and predicates are asked for only when
the library is built, so a process that finds its libraries in the cache never traces (``for_facts``).
"""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, Tuple

from ..abi import FP8_DTYPE, FP8_HEAD_DIMS, SUPPORTED_HEAD_DIMS, __version__
from ..analysis_cache import VariantFacts
from ..cache import cache_key, default_cache
from ..errors import BuildError, InputError
from ..ir import BlockPredicates, TracedVariant
from .ninja import (BWD_LIBRARY_NAME, LIBRARY_NAME, ptxas_serialized_wgmma, ptxas_spill_bytes, run_ninja,
                    write_build_ninja)
from .render import dtype_info, generator_hash, render_sources, template_hash
from .tiles import (SM90_BWD_TILES, bwd_tile_config, decode_tile_config, sm90_bwd_ladder, sm90_fp8_ladder, sm90_ladder,
                    tile_config)
from .toolchain import NVCC_HELP, find_nvcc, nvcc_version

KERNEL_CHOICES = ("auto", "sm80", "sm90")
BWD_KERNEL = "sm80_bwd"  # the portable backward library's family (bwd_sm80.cuh): a kernel value, so it enters the key
SM90_BWD_KERNEL = "sm90_bwd"  # the sm_90a backward (bwd_sm90.cuh)
BWD_KERNELS = (BWD_KERNEL, SM90_BWD_KERNEL)


def library_name(kernel: str) -> str:
    """The file name of a kernel family's library inside its cache entry."""
    return BWD_LIBRARY_NAME if kernel in BWD_KERNELS else LIBRARY_NAME


def choose_bwd_kernel(arch: str, head_dim: int) -> str:
    """The backward family a signature gets: 'sm90_bwd' on sm_90a at the head dims it has tiles for, else the
    portable 'sm80_bwd'."""
    return SM90_BWD_KERNEL if arch == "sm_90a" and head_dim in SM90_BWD_TILES else BWD_KERNEL


def choose_kernel(arch: str, kernel: str = "auto") -> str:
    """'sm90' (TMA + wgmma) on sm_90a unless the portable 'sm80' kernel is asked for; 'sm80_bwd' (the
    portable backward, any sm80+ arch) only when asked for."""
    if kernel == SM90_BWD_KERNEL and arch != "sm_90a":
        raise InputError(f"the sm90 backward needs arch sm_90a (H100/H200), got {arch}; use kernel='{BWD_KERNEL}'")
    if kernel in BWD_KERNELS:
        return kernel
    if kernel not in KERNEL_CHOICES:
        raise InputError(f"kernel must be 'auto', 'sm80' or 'sm90', got {kernel!r}")
    if kernel == "sm90" and arch != "sm_90a":
        raise InputError(f"the sm90 kernel needs arch sm_90a (H100/H200), got {arch}; use backend='sm80'")
    if kernel == "auto":
        return "sm90" if arch == "sm_90a" else "sm80"
    return kernel


@dataclass(frozen=True, eq=False)
class KernelSpec:
    facts: VariantFacts  # the variant's canonical text, mask / score_mod presence, captures, summaries
    name: str       # the variant's readable name
    dtype: str      # 'bfloat16' or 'float16'
    head_dim: int
    arch: str       # 'sm_90a', 'sm_80', ...
    kernel: str     # 'sm90' or 'sm80' (forward, with the KV-cache kernel beside it), 'sm80_bwd' or 'sm90_bwd'
    fast_math: bool = True
    debug: bool = False  # ATTNGEN_DEBUG=1 when the spec was made: captured-tensor reads are bounds-checked
    # () -> (traced variant, predicates): what a build generates code from (the full analysis)
    analysis: Callable[[], Tuple[TracedVariant, BlockPredicates]] = field(default=None, repr=False)

    @classmethod
    def create(cls, traced: TracedVariant, predicates: BlockPredicates, *, name: str, dtype, head_dim: int,
               arch: str, kernel: str = "auto", fast_math: bool = True) -> "KernelSpec":
        """Validate a signature and pick the kernel family for it."""
        return cls.for_facts(VariantFacts.of(traced, predicates), lambda: (traced, predicates), name=name,
                             dtype=dtype, head_dim=head_dim, arch=arch, kernel=kernel, fast_math=fast_math)

    @classmethod
    def for_facts(cls, facts: VariantFacts, analysis: Callable[[], Tuple[TracedVariant, BlockPredicates]], *,
                  name: str, dtype, head_dim: int, arch: str, kernel: str = "auto",
                  fast_math: bool = True) -> "KernelSpec":
        """``create`` from a variant's facts; ``analysis`` runs only if the library has to be built."""
        if head_dim not in SUPPORTED_HEAD_DIMS:
            raise InputError(f"head dim {head_dim} is not supported: expected one of {list(SUPPORTED_HEAD_DIMS)}")
        dtype_name = str(dtype).replace("torch.", "")
        if dtype_name == FP8_DTYPE:
            if kernel not in ("auto", "sm90") or arch != "sm_90a":
                raise InputError(f"FP8 ({FP8_DTYPE}) inputs run on the sm90 forward only (arch sm_90a, H100/H200), got "
                                 f"arch {arch}, kernel {kernel!r}; convert q, k, v to torch.bfloat16 elsewhere")
            if head_dim not in FP8_HEAD_DIMS:
                raise InputError(f"the FP8 forward takes head dim {' or '.join(map(str, FP8_HEAD_DIMS))}, got "
                                 f"{head_dim}; use bfloat16 inputs at this head dim")
        elif dtype_name not in ("bfloat16", "float16"):
            raise InputError(f"the kernels take torch.bfloat16 or torch.float16 (or torch.float8_e4m3fn for the sm90 "
                             f"forward), got {dtype}")
        if kernel == SM90_BWD_KERNEL and head_dim not in SM90_BWD_TILES:
            raise InputError(f"the sm90 backward takes head dims {sorted(SM90_BWD_TILES)}, got {head_dim}; use "
                             f"kernel='{BWD_KERNEL}'")
        return cls(facts, name, dtype_info(dtype)[2], head_dim, arch, choose_kernel(arch, kernel), fast_math,
                   debug_build_requested(), analysis)

    @property
    def traced(self) -> TracedVariant:
        return self.analysis()[0]

    @property
    def predicates(self) -> BlockPredicates:
        return self.analysis()[1]

    def tile_choices(self):
        """sm90: the ladder of tile settings the build tries (all of it changes the binary); sm80: one setting."""
        if self.kernel == "sm90" and self.dtype == FP8_DTYPE:
            return sm90_fp8_ladder(self.facts.has_mask, self.facts.has_score_mod)
        if self.kernel == "sm90":
            return sm90_ladder(self.head_dim, self.facts.has_mask, self.facts.has_score_mod, self.facts.half_plane)
        if self.kernel == BWD_KERNEL:
            return bwd_tile_config(self.head_dim, self.arch)
        if self.kernel == SM90_BWD_KERNEL:
            return sm90_bwd_ladder(self.head_dim, has_score_mod=self.facts.has_score_mod, has_mask=self.facts.has_mask,
                                   half_plane=self.facts.half_plane)
        return tile_config(self.head_dim, self.arch)

    def fields(self, nvcc: Optional[Sequence[int]] = None) -> dict:
        """Everything that changes the binary: the cache key is a hash of these. ``nvcc``: the (major, minor) to
        key with (a prebuilt root's recorded toolchain); default: this machine's nvcc (BuildError without one)."""
        return {
            "variant": self.facts.canonical,
            "summaries": [s.key for s in self.facts.summaries],
            "dtype": self.dtype,
            "head_dim": self.head_dim,
            "arch": self.arch,
            "kernel": self.kernel,
            "tiles": repr(self.tile_choices()),
            # a forward library also holds the KV-cache kernel (jit.render.DECODE_SOURCE)
            **({} if self.kernel in BWD_KERNELS or self.dtype == FP8_DTYPE
               else {"decode_tiles": repr(decode_tile_config(self.head_dim, self.arch))}),
            "fast_math": self.fast_math,
            "templates": template_hash(),
            "generator": generator_hash(),
            "attngen": __version__,
            "nvcc": list(nvcc if nvcc is not None else nvcc_version()),
            # present only in debug builds, so normal builds keep their keys and the two never share one
            **({"debug": True} if self.debug else {}),
        }

    @property
    def uri(self) -> str:
        """Readable name of the library: every key field a person would look for."""
        dt = {"bfloat16": "bf16", "float16": "fp16", FP8_DTYPE: "fp8"}[self.dtype]
        return f"{self.name} {dt} hd{self.head_dim} {self.arch} {self.kernel}" + (" debug" if self.debug else "")

    def variant_inc(self) -> str:
        from ..codegen import render_variant_inc  # sympy: only when a library is built

        traced, predicates = self.analysis()
        return render_variant_inc(traced, predicates, fast_tanh=self.fast_math, fast_exp2=self.fast_math,
                                  fast_div=self.fast_math, debug=self.debug)

    def build(self, build_dir: Path) -> dict:
        """Render, write build.ninja and compile into build_dir; returns what the cache records about it."""
        t0 = time.perf_counter()
        inc = self.variant_inc()
        notes = self.analysis()[1].notes
        if notes:  # on the store's "attngen: building <uri> ..." line
            sys.stderr.write("".join(f"[{n}] " for n in notes))
            sys.stderr.flush()
        info = {}
        if self.kernel in ("sm90", SM90_BWD_KERNEL):
            tiles, spill = build_first_without_spills(build_dir, inc, self.dtype, self.head_dim, self.arch,
                                                      self.tile_choices(), kernel=self.kernel)
            info = {"tiles": repr(tiles), "spill_bytes": spill}
        elif self.kernel == BWD_KERNEL:
            write_build_ninja(build_dir, render_sources(inc, self.dtype, self.head_dim, self.arch, kernel=self.kernel),
                              self.arch, ["-Xptxas", "-v"], library=library_name(self.kernel))
            info = ptxas_report(run_ninja(build_dir))
        else:
            write_build_ninja(build_dir, render_sources(inc, self.dtype, self.head_dim, self.arch, kernel="sm80"),
                              self.arch)
            run_ninja(build_dir)
        for p in list(build_dir.glob("*.o")) + list(build_dir.glob("*.o.d")):
            p.unlink()
        return {"compiler": find_nvcc(), "build_seconds": round(time.perf_counter() - t0, 3),
                "expressions": self.expressions(), **info}

    def expressions(self) -> dict:
        """The variant's expressions as text, recorded in the library's meta.json."""
        traced, predicates = self.analysis()
        return {"score": str(traced.score), "mask": str(traced.mask),
                "kv_range": [str(predicates.kv_lo), str(predicates.kv_hi)], "notes": list(predicates.notes)}

    def key_for_pins(self, pins: Mapping) -> Optional[str]:
        """The cache key of this signature as a prebuilt root built it: ``pins`` is that root's recorded toolchain
        ({"nvcc": [13, 0]}, docs/deploy.md); None when the pins do not say (that root serves nothing here)."""
        nv = pins.get("nvcc")
        if not (isinstance(nv, list) and len(nv) == 2 and all(type(x) is int for x in nv)):
            return None
        return cache_key(self.fields(nvcc=nv))

    def build_cached(self) -> Path:
        """The library of this spec from the on-disk cache, built on a miss (needs nvcc, not a GPU). A hit
        needs only the key fields: no analysis, no sympy (the expressions go into meta.json with the build).
        Without nvcc here only prebuilt roots can serve (keyed by the toolchain they record): a miss there is a
        BuildError naming the roots searched and how to get nvcc."""
        cache = default_cache()
        artifact = library_name(self.kernel)
        try:
            nv = nvcc_version()
        except BuildError as e:  # no nvcc (or none that runs): this machine's key is unknown
            found = cache.lookup(None, self.uri, artifact, key_for=self.key_for_pins)
            if found is not None:
                return found
            roots = ", ".join(str(r) for r in cache.search_roots()) or "none"
            raise BuildError(f"no prebuilt kernel for {self.uri} (searched: {roots}) and no nvcc to build it: "
                             f"{str(e).split('. ')[0]}. Install the attngen-kernels wheel that matches attngen "
                             f"{__version__} (docs/deploy.md), or get nvcc: {NVCC_HELP}.") from e
        fields = self.fields(nvcc=nv)  # any other BuildError (a tile setting that cannot build) is its own
        return cache.get_or_build(cache_key(fields), self.uri, lambda d: self.build(Path(d)), meta={"fields": fields},
                                  artifact=artifact, key_for=self.key_for_pins)


def ptxas_report(output: str) -> dict:
    """Registers per kernel (by mangled-name fragment) and spill bytes of a ``-Xptxas -v`` build output."""
    regs = {}
    for name, n in re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", output, re.S):
        regs[next((k for k in ("bwd_pre", "bwd_post", "bwd_kernel", "fwd_kernel", "decode_kernel", "decode_combine")
                   if k in name), name)] = int(n)
    return {"registers": regs, "spill_bytes": ptxas_spill_bytes(output) or 0}


def debug_build_requested() -> bool:
    """True when ATTNGEN_DEBUG is set to a true value (1, true, yes, on): kernels built now check every
    captured-tensor read against the tensor's size (docs/user-guide.md, "Debugging out-of-range indices")."""
    return os.environ.get("ATTNGEN_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def build_first_without_spills(build_dir: Path, variant_inc: str, dtype, head_dim: int, arch: str, ladder,
                               kernel: str = "sm90"):
    """Build the SM90 library (``kernel`` 'sm90', or the backward 'sm90_bwd') in build_dir with the first rung of
    ``ladder`` that ptxas compiles clean: without spilling (mods that keep many values live push the default tiles
    over the register budget) and without serializing its wgmmas. When none does, the one that spills least,
    unserialized first; a cross_tile rung only if it is clean (it is measured faster only where it builds so).
    Returns (tiles, spill bytes).

    The first rung builds alone (most variants stop there); when it fails, the other rungs build at
    once, each in its own subdirectory, so a heavy mod costs about two builds of wall time, not one per
    rung, and the chosen rung's files replace the first rung's."""
    ladder = tuple(ladder)
    build_dir = Path(build_dir)
    entry = "attngen_bwd_kernel" if kernel == SM90_BWD_KERNEL else "attngen_fwd_kernel"
    clean = (False, 0)

    def build_in(d: Path, tiles) -> tuple:
        sources = render_sources(variant_inc, dtype, head_dim, arch, tiles=tiles, kernel=kernel)
        write_build_ninja(d, sources, arch, ["-Xptxas", "-v"],
                          library=library_name(kernel))
        # the kernel the ladder tunes, not the library's other kernels (decode, pre / post): (serialized, spills)
        out = run_ninja(d)
        return ptxas_serialized_wgmma(out, entry), ptxas_spill_bytes(out, entry) or 0

    cost = build_in(build_dir, ladder[0])
    if cost == clean or len(ladder) == 1:
        return ladder[0], cost[1]
    dirs = [build_dir / f"rung{n}" for n in range(1, len(ladder))]
    try:
        with ThreadPoolExecutor(len(dirs)) as ex:
            costs = list(ex.map(build_in, dirs, ladder[1:]))
        results = [(cost, ladder[0], build_dir)] + list(zip(costs, ladder[1:], dirs))
        found = next((r for r in results if r[0] == clean), None)
        if found is None:
            plain = [r for r in results if not getattr(r[1], "cross_tile", False)] or results
            found = min(plain, key=lambda r: r[0])
        (_, spill), tiles, chosen = found
        if chosen != build_dir:
            for f in chosen.iterdir():  # sources, build.ninja (relative paths), the library
                if f.is_file() and not f.name.startswith("."):
                    shutil.copy2(f, build_dir / f.name)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    return tiles, spill
