"""Toolchain: where nvcc is, which version it is, and the flags that target a GPU architecture."""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from functools import lru_cache
from typing import Optional, Tuple

from ..cache import default_cache, write_if_different
from ..cache.store import register_local_pins
from ..errors import AttngenError, BuildError

NVCC_HELP = (
    "attngen compiles attention kernels at run time and needs CUDA's compiler, nvcc (CUDA 12.0 or newer). "
    "Install it with `pip install attngen[jit]` (the nvidia-cuda-nvcc package), or install the CUDA "
    "toolkit and put its bin/ on PATH or set CUDA_HOME to the toolkit's directory"
)


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
    raise BuildError(f"nvcc not found ({searched}). {NVCC_HELP}.")


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
        raise BuildError(f"could not run {nvcc} --version: {e}. {NVCC_HELP}.") from e
    m = re.search(r"release (\d+)\.(\d+)", out.stdout + out.stderr)
    if out.returncode != 0 or not m:
        raise BuildError(f"{nvcc} --version failed (exit {out.returncode}):\n{out.stdout}{out.stderr}\n{NVCC_HELP}.")
    return int(m.group(1)), int(m.group(2))


def nvcc_version(nvcc: Optional[str] = None) -> Tuple[int, int]:
    """(major, minor) of nvcc, e.g. (13, 0). Part of every cache key, so it is needed on warm loads
    too: remembered in the cache root per (real path, mtime, size) of the binary, so a fresh process
    loading a cached kernel does not spawn nvcc."""
    return _nvcc_version_memo(nvcc or find_nvcc())


MEMO_NAME = "nvcc-versions.json"


@lru_cache(maxsize=None)
def _nvcc_version_memo(nvcc: str) -> Tuple[int, int]:
    """Computing a key must not write: the memo is read from the user cache's existing roots and written only into
    one that already exists and may be written (a pure hit in a read-only cache writes nothing anywhere)."""
    real = os.path.realpath(nvcc)
    st = os.stat(real)
    tag = f"{real}|{st.st_mtime_ns}|{st.st_size}"
    try:
        roots, writable = default_cache().memo_roots()
    except AttngenError:  # an unsafe user cache: the lookup itself says so
        roots, writable = [], None
    data = {}
    for root in roots:
        try:
            doc = json.loads((root / MEMO_NAME).read_text())
        except (OSError, ValueError):
            continue
        v = doc.get(tag) if isinstance(doc, dict) else None
        if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
            return v[0], v[1]
        if root == writable:
            data = doc
    v = _nvcc_version_of(nvcc)
    if writable is not None:
        data[tag] = list(v)
        try:
            write_if_different(writable / MEMO_NAME, json.dumps(data, sort_keys=True))
        except (OSError, AttngenError):
            pass  # an unwritable cache only costs the subprocess next time
    return v


def _local_pins() -> Optional[dict]:
    """This machine's toolchain as a prebuilt root records it ({"nvcc": [13, 0]}), None without a working nvcc."""
    try:
        return {"nvcc": list(nvcc_version())}
    except (AttngenError, OSError):
        return None


register_local_pins(_local_pins)


_ARCH_RE = re.compile(r"^sm_(\d+)([af]?)$")


def parse_arch(arch: str) -> Tuple[int, str]:
    """'sm_90a' -> (90, 'a'); BuildError for anything that is not an sm_NN[a|f] name."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise BuildError(f"unknown GPU architecture {arch!r}: expected 'sm_80', 'sm_86', 'sm_90a', ...")
    return int(m.group(1)), m.group(2)


def arch_number(arch: str) -> int:
    return parse_arch(arch)[0]


def arch_flags(arch: str) -> list:
    """nvcc flags generating machine code for `arch`. Always the explicit -gencode form: `-arch=sm_90a`
    is reported to also run a plain sm_90 pass on nvcc 13."""
    num, suffix = parse_arch(arch)
    return [f"-gencode=arch=compute_{num}{suffix},code=sm_{num}{suffix}"]


def current_arch(device=None) -> str:
    """Architecture of a CUDA device (default: the current one): (9, 0) -> 'sm_90a', (8, 0) -> 'sm_80'."""
    import torch

    if not torch.cuda.is_available():
        raise BuildError("no CUDA device is visible to torch, so the GPU architecture is unknown; pass arch='sm_80' "
                         "(or 'sm_90a', ...) explicitly to build without a GPU")
    major, minor = torch.cuda.get_device_capability(device)
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
