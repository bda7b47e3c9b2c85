"""Prebuilt roots (docs/deploy.md): keyed with the toolchain they record, found without nvcc, with 0 builds and 0
writes; a missing kernel falls back to JIT with one log line; a damaged entry or root manifest is refused.

The fast tests publish fake libraries under the keys a real spec computes (no compiler); the `nvcc` tests run a
tiny `python -m attngen prebuild` and use its root and wheel from fresh processes with nvcc hidden.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import attngen
from attngen.cache import ArtifactCache, CacheWarning, cache_key
from attngen.errors import BuildError
from attngen.jit import toolchain
from attngen import prebuild as pb
from test_cache_readonly import WriteCounter, make_build

PINS = {"nvcc": [12, 9]}  # deliberately not this machine's nvcc: the pins, not the local compiler, key the root
REPO = Path(__file__).resolve().parents[1]


def _spec(**options):
    return attngen.compile(**options).spec(torch.bfloat16, 128, "sm_80")


def _fake_root(root: Path, specs, pins=PINS) -> dict:
    """A prebuilt root holding a fake library for each spec, published under the spec's key for `pins`."""
    cache = ArtifactCache(root, prebuilt=None, readonly=())
    paths = {}
    for spec in specs:
        key = spec.key_for_pins(pins)

        def build(tmp: Path):
            (tmp / "libattngen_fwd.so").write_bytes(b"\x7fELF fake " + key.encode())
            return {}

        paths[spec.uri] = cache.get_or_build(key, spec.uri, build, meta={"fields": spec.fields(nvcc=pins["nvcc"])},
                                             artifact="libattngen_fwd.so")
    (root / "prebuilt.json").write_text(json.dumps({"format": 1, "pins": pins, "entries": []}))
    return paths


@pytest.fixture
def no_nvcc(monkeypatch):
    """attngen's nvcc discovery finds nothing (as on a deployment without the CUDA toolkit)."""
    def missing():
        raise BuildError("nvcc not found (hidden by the test)")

    monkeypatch.setattr(toolchain, "find_nvcc", missing)


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "user"))
    monkeypatch.delenv("ATTNGEN_CACHE_READONLY", raising=False)
    return tmp_path


def test_key_for_pins_is_the_key_of_a_build_with_that_nvcc(monkeypatch):
    spec = _spec(causal=True)
    monkeypatch.setattr("attngen.jit.spec.nvcc_version", lambda: (12, 9))
    assert spec.key_for_pins({"nvcc": [12, 9]}) == cache_key(spec.fields())
    assert spec.key_for_pins({"nvcc": [13, 0]}) != cache_key(spec.fields())
    assert spec.key_for_pins({}) is None and spec.key_for_pins({"nvcc": "13.0"}) is None


def test_prebuilt_root_serves_without_nvcc_with_zero_builds_and_writes(env, no_nvcc, monkeypatch, capsys):
    spec = _spec(causal=True)
    paths = _fake_root(env / "pre", [spec])
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", str(env / "pre"))
    monkeypatch.setenv("ATTNGEN_VERBOSE", "1")
    w = WriteCounter(monkeypatch)
    got = spec.build_cached()  # default_cache(): the environment above
    calls = list(w.calls)
    monkeypatch.undo()
    assert got == paths[spec.uri] and calls == []
    assert not (env / "user").exists()
    assert f"cache hit prebuilt {spec.uri}" in capsys.readouterr().err


def test_the_kernels_package_directory_is_a_prebuilt_root(env, no_nvcc, monkeypatch):
    spec = _spec(causal=True)
    paths = _fake_root(env / "site" / "attngen_kernels", [spec])
    (env / "site" / "attngen_kernels" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(env / "site"))
    assert spec.build_cached() == paths[spec.uri]


def test_without_nvcc_a_missing_kernel_is_one_clear_error(env, no_nvcc, monkeypatch):
    _fake_root(env / "pre", [_spec(causal=True)])
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", str(env / "pre"))
    spec = _spec(window=64)  # (its analysis record is written to the user cache: a miss, traced here)
    w = WriteCounter(monkeypatch)
    with pytest.raises(BuildError, match=r"no prebuilt kernel for sliding_window.*searched: .*pre.*attngen-kernels"):
        spec.build_cached()
    calls = list(w.calls)
    monkeypatch.undo()
    assert calls == []  # refused before any lock or temporary directory


def test_a_missing_kernel_falls_back_to_jit_with_one_log_line(env, capsys):
    spec = _spec(causal=True)
    _fake_root(env / "pre", [spec])
    count: list = []
    ac = ArtifactCache(env / "user", prebuilt=None, readonly=[env / "pre"])
    other = cache_key({"variant": "not prebuilt", "nonce": os.urandom(4).hex()})
    ac.get_or_build(other, "window bf16 hd128 sm_80 sm80", make_build(count), artifact="kernel.so",
                    key_for=lambda pins: cache_key({"variant": "not prebuilt", "pins": pins}))
    err = capsys.readouterr().err
    assert count == [1]
    assert [line for line in err.splitlines() if "no prebuilt kernel" in line] == [
        f"attngen: no prebuilt kernel for window bf16 hd128 sm_80 sm80 in {env / 'pre'}: building it with nvcc (JIT)"]


@pytest.mark.parametrize("damage", ["library", "manifest"])
def test_a_damaged_prebuilt_entry_is_refused(env, no_nvcc, monkeypatch, damage):
    spec = _spec(causal=True)
    so = _fake_root(env / "pre", [spec])[spec.uri]
    if damage == "library":
        so.write_bytes(so.read_bytes() + b"!")
    else:
        m = json.loads((so.parent / "manifest.json").read_text())
        m["files"][so.name]["sha256"] = "0" * 64
        (so.parent / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", str(env / "pre"))
    with pytest.warns(CacheWarning, match="unusable"), pytest.raises(BuildError, match="no prebuilt kernel"):
        spec.build_cached()


def test_a_damaged_root_manifest_is_refused(env, no_nvcc, monkeypatch):
    spec = _spec(causal=True)
    _fake_root(env / "pre", [spec])
    (env / "pre" / "prebuilt.json").write_text("{not json")
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", str(env / "pre"))
    with pytest.warns(CacheWarning, match="prebuilt.json is unreadable"), pytest.raises(BuildError):
        spec.build_cached()


def test_plan_covers_the_default_set_and_refuses_bad_input():
    tasks = pb.plan(list(pb.DEFAULT_VARIANTS), ["bf16", "fp16"], [64, 128, 256], ["sm_90a", "sm_80"])
    assert len(tasks) == len(pb.DEFAULT_VARIANTS) * 2 * 3 * 2 * 2 and len(set(tasks)) == len(tasks)
    with pytest.raises(attngen.errors.InputError, match="--dtypes"):
        pb.plan(["causal"], ["fp8"], [128], ["sm_80"])
    with pytest.raises(attngen.errors.InputError, match="sm_75"):
        pb.plan(["causal"], ["bf16"], [128], ["sm_75"])


# ------------------------------------------------------------------------------- real builds (nvcc lane)

_CHILD = r"""
import json, os, sys, time
import torch, attngen
from attngen.cache import default_cache
attn = attngen.compile(causal=True)
path = attn.spec(torch.bfloat16, 64, "sm_80").build_cached()
print(json.dumps({"path": str(path), "sympy": "sympy" in sys.modules, "traced": attn._analysis is not None}))
"""


def _hidden_nvcc_env(tmp_path: Path, **extra) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "ATTNGEN_NVCC")}
    e["PATH"] = os.path.dirname(sys.executable)  # python only: no nvcc
    e["ATTNGEN_CACHE_DIR"] = str(tmp_path / "user")
    e["ATTNGEN_VERBOSE"] = "1"
    e.update(extra)
    return e


@pytest.mark.requires_nvcc
def test_prebuild_makes_a_root_and_a_wheel_that_serve_without_nvcc(tmp_path):
    run = subprocess.run([sys.executable, "-m", "attngen", "prebuild", "--out", str(tmp_path / "root"), "--variants",
                          "causal", "--dtypes", "bf16", "--head-dims", "64", "--archs", "sm_80", "--jobs", "1",
                          "--no-backward", "--wheel", "--wheel-dir", str(tmp_path / "dist")],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "window 1024 only" in run.stdout and "1 ok, 0 failed" in run.stdout
    doc = json.loads((tmp_path / "root" / "prebuilt.json").read_text())
    assert doc["pins"]["nvcc"] == list(toolchain.nvcc_version()) and doc["attngen"] == attngen.__version__
    (entry,) = doc["entries"]
    assert entry["size"] > 0 and entry["build_seconds"] > 0 and entry["task"]["variant"] == "causal"
    assert sorted(os.listdir(tmp_path / "root")) == ["analysis", "entries", "prebuilt.json"]
    (wheel,) = (tmp_path / "dist").glob("attngen_kernels-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    assert "attngen_kernels/prebuilt.json" in names and any(n.endswith("/RECORD") for n in names)

    for how, extra in (("root", {"ATTNGEN_CACHE_READONLY": str(tmp_path / "root"), "PYTHONPATH": str(REPO)}),
                       ("wheel", {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{REPO}"})):
        child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=tmp_path,
                               env=_hidden_nvcc_env(tmp_path, **extra))
        assert child.returncode == 0, (how, child.stderr)
        got = json.loads(child.stdout.strip().splitlines()[-1])
        assert "cache hit prebuilt causal bf16 hd64 sm_80 sm80" in child.stderr and "building" not in child.stderr
        assert got == {"path": got["path"], "sympy": False, "traced": False}, how
        assert not (tmp_path / "user").exists(), how  # 0 writes: not even the user cache directory
