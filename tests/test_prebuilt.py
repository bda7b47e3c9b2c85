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


def test_one_prebuilt_kernel_serves_every_value_of_a_runtime_parameter(env, no_nvcc, monkeypatch):
    built = _spec(window=1024, softcap=30.0)
    paths = _fake_root(env / "pre", [built])
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", str(env / "pre"))
    specs = [_spec(window=window, softcap=cap) for window, cap in ((128, 50.0), (65536, 7.5))]
    assert {spec.uri for spec in specs} == {built.uri} == {"softcap(cap)+sliding_window(window) bf16 hd128 sm_80 sm80"}
    w = WriteCounter(monkeypatch)
    got = [spec.build_cached() for spec in specs]
    calls = list(w.calls)
    assert got == [paths[built.uri]] * 2 and calls == []  # 0 builds, 0 writes
    # a specialised value is another kernel: not in the root, and no nvcc to build it
    with pytest.raises(BuildError, match="no prebuilt kernel"):
        attngen.compile(mask_mod=attngen.sliding_window(1024, specialize=True)).spec(
            torch.bfloat16, 128, "sm_80").build_cached()


def test_the_kernels_package_directory_is_a_prebuilt_root(env, no_nvcc, monkeypatch):
    # on sys.path before the variant is compiled, as an installed wheel is: the default cache looks for the package
    # once, and with the compile first, this test failed when run alone
    (env / "site" / "attngen_kernels").mkdir(parents=True)
    (env / "site" / "attngen_kernels" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(env / "site"))
    spec = _spec(causal=True)
    paths = _fake_root(env / "site" / "attngen_kernels", [spec])
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
    # per (variant, dtype, head dim, arch): the forward (with the KV-cache kernel inside) and the backward
    assert len(tasks) == len(pb.DEFAULT_VARIANTS) * 2 * 3 * 2 * 2 and len(set(tasks)) == len(tasks)
    with pytest.raises(attngen.errors.InputError, match="--dtypes"):
        pb.plan(["causal"], ["fp32"], [128], ["sm_80"])
    # FP8: the sm90 forward at head dim 128 only, skipped elsewhere in a mixed set, an error when nothing is left
    fp8 = [t for t in pb.plan(list(pb.DEFAULT_VARIANTS), ["bf16", "fp8"], [64, 128, 256], ["sm_90a", "sm_80"])
           if t.dtype == "fp8"]
    assert len(fp8) == len(pb.DEFAULT_VARIANTS) and {(t.arch, t.head_dim, t.kernel) for t in fp8} == {
        ("sm_90a", 128, "auto")}
    with pytest.raises(attngen.errors.InputError, match="--dtypes fp8: the FP8 forward is built for sm_90a"):
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
    assert "serves every value" in run.stdout and "1 ok, 0 failed" in run.stdout
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


def _umask_002(root: Path) -> None:
    """What pip leaves under umask 002: group-writable directories and files."""
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o775)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o664)


def test_a_kernels_package_installed_with_umask_002_breaks_no_lookup(env, monkeypatch):
    spec = _spec(causal=True)
    pkg = env / "site" / "attngen_kernels"
    _fake_root(pkg, [spec])
    _umask_002(pkg)
    count: list = []
    ac = ArtifactCache(env / "user", prebuilt=[pkg], readonly=())
    with pytest.warns(CacheWarning, match=rf"ignoring the read-only kernel root {pkg}.*chmod -R go-w {pkg}") as rec:
        for tag in ("a", "b"):
            ac.get_or_build(cache_key({"tag": tag}), f"k{tag}", make_build(count), key_for=lambda pins: None)
    assert count == [1, 1] and len(rec) == 1


def _fake_nvcc(tmp_path: Path, release: str) -> str:
    exe = tmp_path / "bin" / "nvcc"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    exe.chmod(0o755)
    return str(exe)


def _forget_nvcc_versions():
    toolchain._nvcc_version_memo.cache_clear()
    toolchain._nvcc_version_of.cache_clear()


def test_a_hit_in_a_read_only_cache_dir_writes_nothing_anywhere(env, monkeypatch, capsys):
    """The key (nvcc version memo included) is computed without creating a root, a fallback or a memo file, and
    with no writable directory at all the lookup of an existing kernel still succeeds."""
    from test_cache_readonly import _chmod_tree

    spec = _spec(causal=True)
    nvcc = _fake_nvcc(env, "12.9")
    monkeypatch.setattr(toolchain, "find_nvcc", lambda: nvcc)
    _forget_nvcc_versions()
    key = cache_key(spec.fields())  # a real key, from KernelSpec
    ro = env / "ro"
    so = ArtifactCache(ro, prebuilt=None, readonly=()).get_or_build(
        key, spec.uri, lambda d: (d / "libattngen_fwd.so").write_bytes(b"\x7fELF fake") and None,
        artifact="libattngen_fwd.so")
    _chmod_tree(ro, writable=False)
    blocker = env / "blocker"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(ro))
    monkeypatch.delenv("ATTNGEN_VERBOSE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "xdg"))
    monkeypatch.setattr("tempfile.tempdir", str(blocker))  # the last fallback cannot be created either
    _forget_nvcc_versions()
    capsys.readouterr()
    w = WriteCounter(monkeypatch)
    try:
        got = spec.build_cached()
        calls = list(w.calls)
    finally:
        monkeypatch.undo()
        _chmod_tree(ro, writable=True)
        _forget_nvcc_versions()
    assert got == so and calls == []
    assert capsys.readouterr().err == ""


def test_prebuild_workers_build_into_out_only(env, monkeypatch):
    """An installed attngen_kernels (or ATTNGEN_CACHE_READONLY) must not answer a worker's build: prebuild would
    report success and ship nothing. A task whose path is not under out/entries fails."""
    from attngen.cache import store

    key = cache_key({"tag": "prebuild-worker", "nonce": os.urandom(4).hex()})
    pkg = env / "site" / "attngen_kernels"
    ArtifactCache(pkg, prebuilt=None, readonly=()).get_or_build(key, "k", make_build([]))
    (pkg / "__init__.py").write_text("")
    (pkg / "prebuilt.json").write_text(json.dumps({"format": 1, "pins": PINS}))
    monkeypatch.syspath_prepend(str(env / "site"))
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", str(pkg))
    monkeypatch.setattr(os, "dup2", lambda fd, fd2: None)  # keep pytest's stderr
    monkeypatch.setattr(store, "_pinned_default", [])
    returned = {}

    class FakeSpec:
        uri = "k"

        def build_cached(self):
            if "path" in returned:
                return returned["path"]
            return store.default_cache().get_or_build(key, "k", make_build([]), key_for=lambda pins: key)

        def fields(self):
            return {"tag": "prebuild-worker"}

    class FakeCompiled:
        def __init__(self, variant):
            pass

        def spec(self, *a):
            return FakeSpec()

    monkeypatch.setattr("attngen.frontend.CompiledAttention", FakeCompiled)
    monkeypatch.setattr(pb, "_COMPILED", {})
    out = env / "out"
    pb._worker_init(str(out), str(env / "out.log"))
    task = pb.Task("causal", "bf16", 128, "sm_80", "auto")
    r = pb._build(task)
    assert "error" not in r and (out / "entries" / r["entry"] / "kernel.so").is_file()
    returned["path"] = pkg / "entries" / r["entry"] / "kernel.so"
    pb._COMPILED.clear()
    assert "not from" in pb._build(task)["error"]


@pytest.mark.parametrize("how", ["group_writable", "symlink", "prebuilt_unlisted", "prebuilt_listed"])
def test_analysis_records_of_read_only_roots_are_checked_like_entries(env, monkeypatch, how):
    import hashlib
    from attngen import analysis, analysis_cache
    from attngen.fingerprint import fingerprint

    def forget():
        with analysis._LOCK:
            analysis._ANALYSIS.clear()
        with analysis_cache._LOCK:
            analysis_cache._RECORDS.clear()

    variant = attngen.make_variant(causal=True)
    forget()
    facts, _ = analysis_cache.variant_facts(variant)
    digest = fingerprint(variant).digest
    rel = f"analysis/{digest}.json"
    own = env / "user" / rel
    planted = {**json.loads(own.read_text()), "canonical": "planted", "has_mask": False}
    own.unlink()
    ro = env / "ro"
    (ro / "entries").mkdir(parents=True)
    (ro / "analysis").mkdir()
    text = json.dumps(planted)
    if how == "symlink":
        (env / "elsewhere.json").write_text(text)
        os.symlink(env / "elsewhere.json", ro / rel)
    else:
        (ro / rel).write_text(text)
        os.chmod(ro / rel, 0o666 if how == "group_writable" else 0o644)
    if how.startswith("prebuilt"):
        records = {rel: hashlib.sha256(text.encode()).hexdigest()} if how == "prebuilt_listed" else {}
        (ro / "prebuilt.json").write_text(json.dumps({"format": 1, "pins": PINS, "records": records}))
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", str(ro))
    forget()
    got, _ = analysis_cache.variant_facts(variant)
    forget()
    if how == "prebuilt_listed":  # the root vouches for it by hash
        assert got.canonical == "planted"
    else:
        assert got.canonical == facts.canonical and got.has_mask


def test_a_prebuilt_root_of_another_cuda_major_is_skipped_with_one_log_line(env, monkeypatch, capsys):
    spec = _spec(causal=True)
    paths = _fake_root(env / "pre", [spec], pins={"nvcc": [12, 9]})
    for local, served in (((13, 0), False), ((12, 4), True)):
        monkeypatch.setattr(toolchain, "nvcc_version", lambda nvcc=None, v=local: v)
        monkeypatch.setattr("attngen.jit.spec.nvcc_version", lambda v=local: v)
        ac = ArtifactCache(env / "user", prebuilt=None, readonly=[env / "pre"])
        for _ in range(2):
            ac.forget()
            got = ac.lookup(cache_key(spec.fields()), spec.uri, "libattngen_fwd.so", key_for=spec.key_for_pins)
            assert (got == paths[spec.uri]) if served else got is None
    err = capsys.readouterr().err
    assert err.count("another CUDA major") == 1 and "nvcc 12.9" in err and "13.0" in err
