"""The suite's own plumbing (tests/conftest.py): isolation from the user's home and kernel cache, and the lane
markers every collected test carries."""
import os
import tempfile
from pathlib import Path

import pytest

import attngen.cache as cache


def _inside(path, root) -> bool:
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def test_home_and_caches_are_temporary(attngen_cache_dir, tmp_path_factory):
    tmp = tempfile.gettempdir()
    assert os.environ["ATTNGEN_CACHE_DIR"] == str(attngen_cache_dir)
    assert _inside(attngen_cache_dir, tmp_path_factory.getbasetemp())
    for var in ("HOME", "XDG_CACHE_HOME"):
        assert _inside(os.environ[var], tmp), f"{var}={os.environ[var]} is not a temporary directory"
    assert _inside(Path.home(), tmp) and _inside(Path("~").expanduser(), tmp)
    # attngen's default cache (and everything it writes at its root, e.g. nvcc-versions.json) is the session's
    assert cache.default_cache_dir() == attngen_cache_dir
    assert cache.cache_root() == attngen_cache_dir
    assert cache.default_cache().root == attngen_cache_dir


def test_every_collected_test_carries_its_lane_markers(request):
    """gpu implies nvcc, sm90 implies gpu, heavy implies nvcc, and everything under tests/gpu/ is a gpu test
    (and nothing elsewhere is): what `pytest -m gpu` and `pytest -m "not nvcc"` rely on."""
    gpu_dir = Path(__file__).resolve().parent / "gpu"
    bad = []
    for item in request.session.items:
        names = {m.name for m in item.iter_markers()}
        in_gpu_dir = _inside(item.path, gpu_dir)
        if "gpu" in names and "nvcc" not in names:
            bad.append(f"{item.nodeid}: gpu without nvcc")
        if "sm90" in names and "gpu" not in names:
            bad.append(f"{item.nodeid}: sm90 without gpu")
        if "heavy" in names and "nvcc" not in names:
            bad.append(f"{item.nodeid}: heavy without nvcc")
        if in_gpu_dir != ("gpu" in names):
            bad.append(f"{item.nodeid}: {'in' if in_gpu_dir else 'outside'} tests/gpu/ but "
                       f"{'not ' if in_gpu_dir else ''}marked gpu")
    assert not bad, "\n".join(bad)


@pytest.mark.requires_nvcc
def test_nvcc_version_memo_lands_in_the_session_cache(attngen_cache_dir):
    """attngen remembers nvcc's version in <cache root>/nvcc-versions.json: with the suite's isolation that is the
    session's cache, never ~/.cache/attngen."""
    from attngen.jit import toolchain

    toolchain._nvcc_version_memo.cache_clear()  # an earlier test may have filled the in-process memo
    assert toolchain.nvcc_version() >= (12, 0)
    assert (attngen_cache_dir / "nvcc-versions.json").is_file()
