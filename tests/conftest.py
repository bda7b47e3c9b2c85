"""Test-suite plumbing: what the machine can do (nvcc, a GPU, an sm_90 GPU), the lane markers derived from
it, and an environment that keeps every test away from the user's home and kernel cache.

Requirements, as markers or as fixtures (a fixture counts for every test that uses it, directly or through
another fixture, so a build fixture that takes `requires_nvcc` marks all of its tests):

    @pytest.mark.requires_nvcc   / fixture requires_nvcc   compiles with nvcc (no GPU needed)
    @pytest.mark.requires_gpu    / fixture requires_gpu    runs kernels on a CUDA GPU (and compiles them)
    @pytest.mark.requires_sm90   / fixture requires_sm90   runs kernels on an sm_90 GPU (H100 / H200)

At collection each such test gets the lane markers it implies (requires_nvcc -> nvcc; requires_gpu -> gpu +
nvcc; requires_sm90 -> sm90 + gpu + nvcc) and a skip naming what is missing. A test marked with a lane marker
directly (`@pytest.mark.gpu`) is treated the same way. Lanes:

    python -m pytest -q -m "not nvcc"    fast CPU lane (no kernel builds, no heavy tests): under a minute on 2 cores
    python -m pytest -q                  everything (kernel builds with nvcc; GPU tests skip without a GPU)
    python -m pytest -q -m gpu           the device suite (scripts/gpu_round.sh)

`@pytest.mark.heavy` puts a CPU test in the full lane only: it gets the `nvcc` lane marker (the fast lane's
selector) but no requirement and no skip.

nvcc is found the way attngen finds it (its own discovery: $ATTNGEN_NVCC, PATH, CUDA_HOME, the pip wheel), so a
test is skipped exactly when attngen itself could not build.

Threads: torch runs one intra-op thread (ATTNGEN_TEST_TORCH_THREADS to change it).

Isolation: before any test module is imported, HOME, XDG_CACHE_HOME and ATTNGEN_CACHE_DIR point into a fresh
temporary directory (pytest_configure, so even import-time work of attngen cannot reach ~/.cache/attngen), and
for the tests themselves the autouse session fixture `attngen_cache_dir` points ATTNGEN_CACHE_DIR at a fresh
directory from tmp_path_factory. Both are restored / removed at the end of the session.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# ----------------------------------------------------------------------------------------------------------
# isolation from the user's home and cache

_ISOLATED_VARS = {"HOME": "home", "XDG_CACHE_HOME": "xdg-cache", "ATTNGEN_CACHE_DIR": "attngen-cache"}
_saved_env: dict = {}
_env_root: Path | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """Runs before collection imports any test module (and with it attngen)."""
    global _env_root
    if _env_root is not None:
        return
    _env_root = Path(tempfile.mkdtemp(prefix="attngen-tests-"))
    for var, sub in _ISOLATED_VARS.items():
        _saved_env[var] = os.environ.get(var)
        d = _env_root / sub
        d.mkdir(mode=0o700)
        os.environ[var] = str(d)
    # The CPU tests use small tensors: on a busy 2-core box torch's intra-op threads only contend (the fast lane
    # ran ~1.4x faster on one). ATTNGEN_TEST_TORCH_THREADS overrides.
    import torch

    torch.set_num_threads(int(os.environ.get("ATTNGEN_TEST_TORCH_THREADS", "1")))


def pytest_unconfigure(config):
    global _env_root
    if _env_root is None:
        return
    for var, old in _saved_env.items():
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old
    shutil.rmtree(_env_root, ignore_errors=True)
    _env_root = None


@pytest.fixture(scope="session", autouse=True)
def attngen_cache_dir(tmp_path_factory):
    """The kernel cache of this test session: ATTNGEN_CACHE_DIR set to a fresh, empty directory (mode 0700)
    for the whole session, before any test runs. Tests that need a cache of their own make one in tmp_path.
    ATTNGEN_TEST_SHARED_CACHE (an absolute scratch path; GPU rounds under pytest -n set it) names one directory
    for every worker instead, so a signature several workers use is built once, under the cache's entry lock,
    rather than once per worker."""
    shared = os.environ.get("ATTNGEN_TEST_SHARED_CACHE")
    if shared:
        if not os.path.isabs(shared):
            raise pytest.UsageError(f"ATTNGEN_TEST_SHARED_CACHE must be an absolute path, got {shared!r}")
        d = Path(shared)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        d = tmp_path_factory.mktemp("attngen-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNGEN_CACHE_DIR", str(d))
    yield d
    mp.undo()


# ----------------------------------------------------------------------------------------------------------
# what this machine can do (each probed once, lazily: a broken attngen import only skips the nvcc tests)


@functools.lru_cache(maxsize=None)
def nvcc_missing() -> str | None:
    """None if attngen's nvcc discovery finds a compiler, else why not (the skip reason)."""
    try:
        from attngen.jit.toolchain import nvcc_available
    except Exception as e:  # attngen mid-refactor must not break collection of the CPU tests
        return f"needs nvcc (attngen's nvcc discovery failed to import: {type(e).__name__}: {e})"
    return None if nvcc_available() else "needs nvcc (attngen found none: pip install attngen[jit], or set CUDA_HOME)"


@functools.lru_cache(maxsize=None)
def gpu_missing() -> str | None:
    """None if torch sees a CUDA GPU, else the skip reason."""
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU"


@functools.lru_cache(maxsize=None)
def sm90_missing() -> str | None:
    """None if the current CUDA device is sm_90 (H100 / H200), else the skip reason."""
    import torch

    if not torch.cuda.is_available():
        return "needs an sm_90 GPU (H100 / H200); no CUDA GPU"
    cap = torch.cuda.get_device_capability()
    return None if cap == (9, 0) else f"needs an sm_90 GPU (H100 / H200); this one is sm_{cap[0]}{cap[1]}"


# requirement -> (lane markers it implies, probes in order)
_REQUIREMENTS = {
    "requires_nvcc": (("nvcc",), (nvcc_missing,)),
    "requires_gpu": (("nvcc", "gpu"), (nvcc_missing, gpu_missing)),
    "requires_sm90": (("nvcc", "gpu", "sm90"), (nvcc_missing, gpu_missing, sm90_missing)),
}
_LANE_TO_REQUIREMENT = {"nvcc": "requires_nvcc", "gpu": "requires_gpu", "sm90": "requires_sm90"}


def requirements_of(item) -> set:
    """requires_* names an item asks for: as markers, as lane markers, or as fixtures anywhere in its closure."""
    wanted = set()
    for m in item.iter_markers():
        if m.name in _REQUIREMENTS:
            wanted.add(m.name)
        elif m.name in _LANE_TO_REQUIREMENT:
            wanted.add(_LANE_TO_REQUIREMENT[m.name])
    wanted.update(f for f in getattr(item, "fixturenames", ()) if f in _REQUIREMENTS)
    return wanted


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m deselection sees the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        wanted = requirements_of(item)  # before any lane marker is added below
        lanes, probes = set(), []
        for req in sorted(wanted):
            lanes.update(_REQUIREMENTS[req][0])
            probes += [p for p in _REQUIREMENTS[req][1] if p not in probes]
        if item.get_closest_marker("heavy") is not None:
            lanes.add("nvcc")  # full lane only; no requirement, no skip
        have = {m.name for m in item.iter_markers()}
        for lane in sorted(lanes - have):
            item.add_marker(getattr(pytest.mark, lane))
        for probe in probes:
            reason = probe()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))
                break


@pytest.fixture(scope="session")
def requires_nvcc():
    """Use as a fixture (e.g. by a build fixture) to mark its tests `nvcc` and skip them without nvcc."""
    assert nvcc_missing() is None, "skipped at collection"


@pytest.fixture(scope="session")
def requires_gpu(requires_nvcc):
    """Use as a fixture to mark its tests `gpu` + `nvcc` and skip them without a GPU or nvcc."""
    assert gpu_missing() is None, "skipped at collection"


@pytest.fixture(scope="session")
def requires_sm90(requires_gpu):
    """Use as a fixture to mark its tests `sm90` + `gpu` + `nvcc` and skip them without an sm_90 GPU."""
    assert sm90_missing() is None, "skipped at collection"


@pytest.fixture(scope="session")
def nvcc_path(requires_nvcc) -> str:
    """Absolute path of the nvcc attngen would use."""
    from attngen.jit.toolchain import find_nvcc

    return find_nvcc()


def pytest_runtest_logreport(report):
    """ATTNGEN_TEST_FAILURES=path: each failure's traceback is appended there as it happens, so a device run cut
    short by its time limit still says what failed and why (pytest prints its summary only at the end)."""
    path = os.environ.get("ATTNGEN_TEST_FAILURES")
    if path and report.failed:
        with open(path, "a") as f:
            f.write(f"=== {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")
