"""``python -m attngen prebuild``: the library variants built ahead of time into a prebuilt root, and the
``attngen-kernels`` wheel that installs it (docs/deploy.md).

A prebuilt root is an ordinary cache root (``entries/<name>-<key16>/``, each verified by its manifest, and
``analysis/`` records) plus ``prebuilt.json``: the toolchain its entries were keyed with ("pins", the nvcc
version), the attngen version, the template hash, the Python / torch / sympy versions the analysis records hold
for, and every entry with its size and build time. A machine without nvcc keys its lookups in that root with the
pinned nvcc version (``KernelSpec.key_for_pins``), so it finds the libraries without a compiler.

Builds run in ``--jobs`` worker processes, each one ``KernelSpec.build_cached()`` into the output root (so a
second run only builds what is missing). Prebuilt entries are then made smaller: the host symbol tables are
stripped (``strip --strip-unneeded``: the device code and the exported C ABI are untouched) and the build's
sources dropped but for ``variant.inc`` and the configuration ``attngen_fwd.cu``; the manifest is rewritten.
"""
from __future__ import annotations

import base64
import concurrent.futures as cf
import datetime
import hashlib
import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, List, Optional

from .abi import __version__
from .cache import MANIFEST_NAME, META_NAME, PREBUILT_MANIFEST, write_manifest
from .errors import InputError
from .jit.render import BWD_KERNEL_SOURCE, DECODE_SOURCE, KERNEL_SOURCE, VARIANT_INCLUDE
from .jit.toolchain import MEMO_NAME

# The library variants a deployment reaches for: one build per variant, not per value, since library numbers are
# runtime parameters (kernel arguments, attngen/params.py). The values below only pick the analysis record's
# example; sliding_window(1024)'s kernel serves every window.
DEFAULT_VARIANTS = {
    "full": "full",
    "causal": "causal()",
    "sliding_window": "sliding_window(1024)",
    "local": "local(512, 512)",
    "softcap": "softcap(30)",
    "softcap_causal": "softcap(30)+causal()",
    "softcap_window": "softcap(30)+sliding_window(1024)",
    "alibi": "alibi(16)",
    "alibi_causal": "alibi(16)+causal()",
    "prefix_lm": "prefix_lm(2048)",
    "chunked": "chunked(2048)",
    "document": "document(int64)",      # one build serves any document ids of that dtype (any length)
    "document_i32": "document(int32)",
}
PARAMETER_NOTE = ("library parameters are kernel arguments: each prebuilt variant serves every value of its numbers "
                  "(any window, cap, chunk or prefix length, local bounds with the same unbounded sides, ALiBi head "
                  "count); a variant made with specialize=True, or a user mod closing over a Python constant, is "
                  "another kernel, built on first use (nvcc needed)")
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}  # fp8: the sm90 forward at FP8_HEAD_DIMS
INDEX_LIMIT_BYTES = 100 * 1000 * 1000  # PyPI's default file size limit
KEEP_SOURCES = (VARIANT_INCLUDE, KERNEL_SOURCE, DECODE_SOURCE, BWD_KERNEL_SOURCE)  # what a prebuilt entry keeps of its build


@dataclass(frozen=True)
class Task:
    variant: str  # a name of DEFAULT_VARIANTS or a CLI variant spec
    dtype: str    # 'bf16' / 'fp16' / 'fp8'
    head_dim: int
    arch: str
    kernel: str   # 'auto' (the forward for the arch, with the KV-cache kernel beside it), 'sm80_bwd' or 'sm90_bwd'

    def label(self) -> str:
        return f"{self.variant} {self.dtype} hd{self.head_dim} {self.arch} {'bwd' if self.kernel != 'auto' else 'fwd'}"


def variant_of(name_or_spec: str, device: str = "cpu", length: int = 8):
    """The Variant of a DEFAULT_VARIANTS name or of a CLI spec; document(int32|int64) captures `length` ids of that
    dtype on `device` (the kernel's key depends on the dtype only, its analysis record on the tensor's metadata)."""
    import torch

    from .specs import parse_variant
    from .mods import Variant
    from .variants import document

    spec = DEFAULT_VARIANTS.get(name_or_spec, name_or_spec)
    if spec == "full":
        return Variant(score_mod=None, mask_mod=None)
    m = re.fullmatch(r"document\((int32|int64)\)", spec.replace(" ", ""))
    if m:
        ids = torch.zeros(length, dtype=getattr(torch, m.group(1)), device=device)
        return Variant(score_mod=None, mask_mod=document(ids))
    return parse_variant(spec)


def plan(variants: Iterable[str], dtypes: Iterable[str], head_dims: Iterable[int], archs: Iterable[str],
         backward: bool = True) -> List[Task]:
    from .abi import FP8_HEAD_DIMS
    from .jit.spec import choose_bwd_kernel
    from .specs import resolve_arch

    out = []
    for arch in archs:
        a, _ = resolve_arch(arch, "auto")
        for v in variants:
            variant_of(v)  # a bad spec fails here, before any worker starts
            for dt in dtypes:
                if dt not in DTYPES:
                    raise InputError(f"--dtypes: {dt!r} is not one of {', '.join(DTYPES)}")
                for hd in head_dims:
                    if dt == "fp8":  # the FP8 forward alone (inference), where it exists
                        if a == "sm_90a" and int(hd) in FP8_HEAD_DIMS:
                            out.append(Task(v, dt, int(hd), a, "auto"))
                        continue
                    # the backward a call on this arch runs: sm90_bwd on sm_90a at head dims 64 / 128
                    kinds = ("auto", choose_bwd_kernel(a, int(hd))) if backward else ("auto",)
                    out += [Task(v, dt, int(hd), a, k) for k in kinds]
    if not out and "fp8" in dtypes:  # asked for FP8 alone where it does not exist (in a mixed set it is skipped there)
        raise InputError(f"--dtypes fp8: the FP8 forward is built for sm_90a at head dim "
                         f"{' or '.join(map(str, FP8_HEAD_DIMS))} only; add --archs sm_90a and --head-dims 128")
    return out


# ------------------------------------------------------------------------------------------------ workers

_COMPILED = {}


_OUT: List[Path] = []  # the worker's output root


def _worker_init(out: str, log_path: str) -> None:
    from .cache import ArtifactCache
    from .cache.store import set_default_cache

    os.environ["ATTNGEN_CACHE_DIR"] = out
    os.environ.pop("ATTNGEN_CACHE_READONLY", None)
    # Only --out: an installed attngen_kernels, attngen/prebuilt or a fallback root would answer instead of a build.
    set_default_cache(ArtifactCache(out, prebuilt=None, readonly=(), fallback=()))
    _OUT[:] = [Path(out)]
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)  # the store's build lines and compiler output go to the log, not interleaved on the terminal


def _build(task: Task) -> dict:
    from .cache import cache_key
    from .errors import AttngenError, BuildError
    from .frontend import CompiledAttention

    t0 = time.perf_counter()
    try:
        attn = _COMPILED.get(task.variant)
        if attn is None:
            attn = _COMPILED[task.variant] = CompiledAttention(variant_of(task.variant))
        spec = attn.spec(DTYPES[task.dtype], task.head_dim, task.arch, task.kernel)
        path = spec.build_cached()
        key = cache_key(spec.fields())
        entries = (_OUT[0] / "entries").resolve()
        if entries not in path.resolve().parents:
            raise BuildError(f"{spec.uri} came from {path}, not from {entries}: the prebuilt root would lack it")
    except AttngenError as e:
        return {"task": asdict(task), "error": str(e).strip().splitlines()[0][:400],
                "seconds": round(time.perf_counter() - t0, 2)}
    return {"task": asdict(task), "key": key, "entry": path.parent.name, "name": spec.uri,
            "seconds": round(time.perf_counter() - t0, 2)}


# ------------------------------------------------------------------------------------------------ the root


def slim_entry(entry: Path, strip: Optional[str]) -> bool:
    """Drop the build sources of a published entry (all but KEEP_SOURCES), strip the host symbols of its library
    and rewrite its manifest; True when it changed. The key stays: the device code and the ABI are the same."""
    meta = json.loads((entry / META_NAME).read_text())
    if meta.get("prebuilt_slim"):
        return False
    artifact = meta["artifact"]
    for f in entry.iterdir():
        if f.name not in (artifact, META_NAME, MANIFEST_NAME, *KEEP_SOURCES):
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    if strip:
        subprocess.run([strip, "--strip-unneeded", str(entry / artifact)], check=True, capture_output=True)
    meta["prebuilt_slim"] = {"stripped": bool(strip), "kept_sources": list(KEEP_SOURCES)}
    (entry / META_NAME).write_text(json.dumps(meta, indent=2) + "\n")
    write_manifest(entry, meta["key"], artifact, meta["name"])
    return True


def _dir_size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())


def _versions() -> dict:
    import torch
    from importlib.metadata import version

    from .jit.render import generator_hash, template_hash
    from .jit.toolchain import find_nvcc, nvcc_version

    try:
        sympy_version = version("sympy")
    except Exception:  # noqa: BLE001 - unknown is recorded as such
        sympy_version = "unknown"
    return {"attngen": __version__, "templates": template_hash(), "generator": generator_hash(), "pins": {"nvcc": list(nvcc_version())},
            "nvcc_path": find_nvcc(), "python": sys.version.split()[0], "torch": torch.__version__,
            "sympy": sympy_version}


def _check_reusable(out: Path, versions: dict) -> None:
    """An output root from another attngen / template / generator / nvcc version would mix stale entries into the
    wheel."""
    old = out / PREBUILT_MANIFEST
    if not old.exists():
        return
    doc = json.loads(old.read_text())
    for k in ("attngen", "templates", "generator", "pins"):
        if doc.get(k) != versions[k]:
            raise InputError(f"{out} holds a prebuilt root of another {k} ({doc.get(k)} here, {versions[k]} now); "
                             f"its entries would never be found. Fix: remove {out} or pass another --out.")


def write_root_manifest(out: Path, versions: dict, results: list, wall: float, jobs: int) -> dict:
    """prebuilt.json over every entry in out/entries (this run's and earlier runs'), with this run's failures."""
    old = out / PREBUILT_MANIFEST
    by_key = {e["key"]: e["task"] for e in (json.loads(old.read_text())["entries"] if old.exists() else ()) if "task" in e}
    by_key.update({r["key"]: r["task"] for r in results if "key" in r})  # earlier runs' entries keep their task
    entries = []
    for d in sorted((out / "entries").iterdir()):
        meta = json.loads((d / META_NAME).read_text())
        nv = meta.get("fields", {}).get("nvcc")
        if nv != versions["pins"]["nvcc"]:
            raise InputError(f"{d} was built with nvcc {nv}, the root pins {versions['pins']['nvcc']}. "
                             f"Fix: remove it, or prebuild into a fresh --out.")
        entries.append({"key": meta["key"], "name": meta["name"], "dir": d.name, "size": _dir_size(d),
                        "build_seconds": meta.get("build_seconds"), "created": meta.get("created"),
                        **({"task": by_key[meta["key"]]} if meta["key"] in by_key else {})})
    records = {f"analysis/{f.name}": hashlib.sha256(f.read_bytes()).hexdigest()
               for f in sorted((out / "analysis").glob("*.json"))}  # the records lookups trust (cache.md)
    doc = {"format": 1, **versions, "note": PARAMETER_NOTE, "records": records,
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "entries": entries, "total_bytes": sum(e["size"] for e in entries),
           "build_seconds_sum": round(sum(e["build_seconds"] or 0 for e in entries), 1),
           "last_run": {"wall_seconds": round(wall, 1), "jobs": jobs, "tasks": len(results),
                        "failed": [r for r in results if "error" in r]}}
    (out / PREBUILT_MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")
    os.chmod(out / PREBUILT_MANIFEST, 0o644)
    return doc


def prebuild(out: Path, tasks: List[Task], jobs: int, strip: bool = True, say=print) -> dict:
    """Build `tasks` into the prebuilt root `out` with `jobs` worker processes; returns prebuilt.json."""
    out = out.absolute()
    versions = _versions()
    _check_reusable(out, versions)
    (out / "entries").mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}.log"
    say(f"attngen prebuild: {len(tasks)} libraries into {out} with {jobs} jobs (nvcc {versions['pins']['nvcc']}, "
        f"log {log_path})\nnote: {PARAMETER_NOTE}")
    t0 = time.perf_counter()
    results = []
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: no forked torch state
    with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init,
                                initargs=(str(out), str(log_path))) as ex:
        futures = {ex.submit(_build, t): t for t in tasks}
        for n, fut in enumerate(cf.as_completed(futures), 1):
            r = fut.result()
            results.append(r)
            what = f"FAILED: {r['error']}" if "error" in r else f"{r['seconds']:.1f} s"
            say(f"[{n}/{len(tasks)}] {futures[fut].label()}: {what}")
    wall = time.perf_counter() - t0
    strip_exe = shutil.which("strip") if strip else None
    if strip and strip_exe is None:
        say("note: `strip` (binutils) not found: libraries keep their host symbol tables (about 30% larger)")
    for d in sorted((out / "entries").iterdir()):
        slim_entry(d, strip_exe)
    for leftover in ("tmp", "locks"):
        shutil.rmtree(out / leftover, ignore_errors=True)
    (out / MEMO_NAME).unlink(missing_ok=True)  # a per-machine memo, not part of a root
    doc = write_root_manifest(out, versions, results, wall, jobs)
    failed = doc["last_run"]["failed"]
    say(f"prebuilt root {out}: {len(doc['entries'])} libraries, {doc['total_bytes'] / 1e6:.1f} MB; this run "
        f"{len(results) - len(failed)} ok, {len(failed)} failed in {wall:.0f} s wall ({jobs} jobs); build time of "
        f"all entries {doc['build_seconds_sum']:.0f} s")
    say(f"use it: ATTNGEN_CACHE_READONLY={out} (or `--wheel` to package it)")
    return doc


# ------------------------------------------------------------------------------------------------ the wheel


def _platform_tag(root: Path) -> str:
    """manylinux_2_N_<machine> with N the newest GLIBC_2.N symbol version the libraries need (auditwheel's rule
    for glibc; `auditwheel show` confirms the rest of the policy)."""
    newest = 17
    for so in root.rglob("*.so"):
        for m in re.finditer(rb"GLIBC_2\.(\d+)", so.read_bytes()):
            newest = max(newest, int(m.group(1)))
    return f"manylinux_2_{newest}_{platform.machine()}"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(root: Path, wheel_dir: Path, say=print) -> Path:
    """The attngen-kernels wheel of a prebuilt root: package `attngen_kernels` = prebuilt.json + entries/ +
    analysis/, requiring the attngen version it was built for. Returns its path."""
    doc = json.loads((root / PREBUILT_MANIFEST).read_text())
    version = doc["attngen"]
    tag = f"py3-none-{_platform_tag(root)}"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    path = wheel_dir / f"attngen_kernels-{version}-{tag}.whl"
    dist = f"attngen_kernels-{version}.dist-info"
    files = {"attngen_kernels/__init__.py": (
        f'"""Prebuilt attngen {version} kernels (nvcc {doc["pins"]["nvcc"]}): attngen finds this directory by the '
        f'package name and looks kernels up here, read-only, before its own cache (docs/deploy.md)."""\n'
        f'from pathlib import Path\n\nROOT = Path(__file__).resolve().parent\n').encode()}
    for sub in ("entries", "analysis"):
        for f in sorted((root / sub).rglob("*")) if (root / sub).is_dir() else []:
            if f.is_file():
                files[f"attngen_kernels/{f.relative_to(root).as_posix()}"] = f.read_bytes()
    files["attngen_kernels/" + PREBUILT_MANIFEST] = (root / PREBUILT_MANIFEST).read_bytes()
    files[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: attngen-kernels\nVersion: {version}\n"
        f"Summary: Prebuilt attngen {version} attention kernels ({len(doc['entries'])} libraries, nvcc "
        f"{'.'.join(map(str, doc['pins']['nvcc']))}); no nvcc needed at run time\n"
        f"Requires-Python: >=3.10\nRequires-Dist: attngen=={version}\n\n{PARAMETER_NOTE}.\n").encode()
    files[f"{dist}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: attngen prebuild\nRoot-Is-Purelib: false\n"
                              f"Tag: {tag}\n").encode()
    files[f"{dist}/top_level.txt"] = b"attngen_kernels\n"
    record = "".join(f"{n},{_record_hash(b)},{len(b)}\n" for n, b in files.items()) + f"{dist}/RECORD,,\n"
    files[f"{dist}/RECORD"] = record.encode()
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for n, b in files.items():
            info = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))  # reproducible
            info.external_attr = (0o755 if n.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, b, compresslevel=9)
    os.replace(tmp, path)
    size = path.stat().st_size
    say(f"wheel {path}: {size / 1e6:.1f} MB ({sum(len(b) for b in files.values()) / 1e6:.1f} MB installed), "
        f"{'within' if size <= INDEX_LIMIT_BYTES else 'OVER'} the {INDEX_LIMIT_BYTES / 1e6:.0f} MB index limit")
    return path
