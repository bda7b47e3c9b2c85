"""Tests of attngen.cache: keys, atomic publish, locking across real processes, validation, safety.

CPU only: build functions write bytes instead of running nvcc.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import attngen.cache as cache
from attngen.cache import ArtifactCache, CacheError, CacheWarning, cache_key

REPO = Path(__file__).resolve().parents[1]
FIELDS = {
    "variant": "Add(Symbol('score'), Mul(Integer(-1), Symbol('kv')))",
    "dtype": "bf16",
    "head_dim": 128,
    "captured": [["float32", 1]],
    "flags": {"causal": True, "softcap": 30.0},
    "arch": "sm_90a",
}


def fresh_key(tag: str) -> str:
    # Random content so a stale entry from an earlier run can never make a test pass.
    return cache_key({**FIELDS, "tag": tag, "nonce": os.urandom(8).hex()})


def make_build(count_file: Path, payload: bytes = b"\x7fELF fake kernel", sleep: float = 0.0):
    def build(tmp: Path):
        with open(count_file, "a") as f:
            f.write(f"{os.getpid()}\n")
        (tmp / "kernel.cu").write_text("// generated\n")
        (tmp / "build.ninja").write_text("rule nvcc\n")
        if sleep:
            time.sleep(sleep)
        (tmp / "kernel.so").write_bytes(payload)
        return {"compiler": "fake"}

    return build


def builds(count_file: Path) -> int:
    return len(count_file.read_text().splitlines()) if count_file.exists() else 0


# Child process: waits for `go`, then asks for the key; its build appends to the count file and holds for
# `sleep` seconds, or until the `release` file appears. It imports attngen.cache without running the package's
# __init__ (which imports torch: seconds per process on a 2-core CI box); the cache needs neither.
CHILD = textwrap.dedent(
    """
    import importlib.util, os, sys, time, types
    from pathlib import Path
    pkg = types.ModuleType("attngen")
    pkg.__path__ = list(importlib.util.find_spec("attngen").submodule_search_locations)
    sys.modules["attngen"] = pkg
    from attngen.cache import ArtifactCache
    root, key, count, sleep, ready, go, release = sys.argv[1:8]
    def build(tmp):
        with open(count, "a") as f:
            f.write(f"{os.getpid()}\\n")
        (tmp / "kernel.cu").write_text("// generated\\n")
        (tmp / "kernel.so").write_bytes(b"partial")
        Path(tmp, "started").write_text("1")
        Path(count + ".started").write_text(str(tmp))
        for _ in range(int(float(sleep) / 0.005)):  # hold for `sleep` s at most (a count, not a clock read)
            if release != "-" and os.path.exists(release):
                break
            time.sleep(0.005)
        (tmp / "kernel.so").write_bytes(b"\\x7fELF built by " + str(os.getpid()).encode())
        return {"compiler": "fake"}
    Path(ready).write_text("1")
    while go != "-" and not os.path.exists(go):
        time.sleep(0.005)
    p = ArtifactCache(root, prebuilt=None).get_or_build(key, "child kernel", build)
    print(p)
    print(p.read_bytes().decode("latin-1"))
    """
)


def spawn(root: Path, key: str, count: Path, sleep: float, ready: Path, go: str, release: str = "-") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), key, str(count), str(sleep), str(ready), go, release],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for(pred, timeout=20.0, what="condition"):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def ac(root) -> ArtifactCache:
    return ArtifactCache(root, prebuilt=None)


# ----------------------------------------------------------------------------------------------- keys


def test_key_ignores_dict_order_and_tuple_vs_list():
    a = dict(FIELDS)
    b = {k: FIELDS[k] for k in reversed(list(FIELDS))}
    b["flags"] = {"softcap": 30.0, "causal": True}
    b["captured"] = [("float32", 1)]
    assert list(a) != list(b)
    assert cache_key(a) == cache_key(b)
    assert len(cache_key(a)) == 64 and int(cache_key(a), 16) >= 0


@pytest.mark.parametrize(
    "path, value",
    [
        (("flags", "softcap"), 30.000001),
        (("flags", "causal"), False),
        (("head_dim",), 64),
        (("head_dim",), 128.0),  # int vs float is a different C literal
        (("variant",), "Add(Symbol('score'), Mul(Integer(-2), Symbol('kv')))"),
        (("arch",), "sm_80"),
    ],
)
def test_changed_constant_changes_key(path, value):
    changed = json.loads(json.dumps(FIELDS))
    d = changed
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value
    assert cache_key(changed) != cache_key(FIELDS)


def test_key_supports_sets_paths_dtypes_and_rejects_unstable_objects():
    import torch

    assert cache_key({"s": {3, 1, 2}}) == cache_key({"s": {2, 3, 1}})
    assert cache_key({"d": torch.bfloat16}) == cache_key({"d": "torch.bfloat16"})
    assert cache_key({"d": torch.bfloat16}) != cache_key({"d": torch.float16})
    assert cache_key({"p": Path("a/b")}) == cache_key({"p": "a/b"})
    with pytest.raises(CacheError, match=r"fields\['x'\].*object"):
        cache_key({"x": object()})


def test_write_if_different(tmp_path):
    p = tmp_path / "gen" / "kernel.cu"
    assert cache.write_if_different(p, "int x;\n") is True
    m = p.stat().st_mtime_ns
    time.sleep(0.01)
    assert cache.write_if_different(p, "int x;\n") is False
    assert p.stat().st_mtime_ns == m
    assert cache.write_if_different(p, "int y;\n") is True
    assert p.read_text() == "int y;\n"
    assert [x.name for x in p.parent.iterdir()] == ["kernel.cu"]  # no temp files left


# ------------------------------------------------------------------------------------ build & publish


def test_build_publishes_complete_entry_and_logs_one_line(ac, root, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ATTNGEN_VERBOSE", raising=False)
    count = tmp_path / "count"
    key = fresh_key("publish")
    meta = {"fields": FIELDS, "expressions": {"score": "score - kv"}}
    p = ac.get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count), meta)
    assert p.read_bytes() == b"\x7fELF fake kernel" and p.name == "kernel.so"
    entry = p.parent
    assert entry.parent == root / "entries"
    assert entry.name == f"causal_bf16_hd128_sm_90a-{key[:16]}"
    m = json.loads((entry / "meta.json").read_text())
    assert m["name"] == "causal bf16 hd128 sm_90a" and m["key"] == key
    assert m["fields"] == FIELDS and m["expressions"] == {"score": "score - kv"}
    assert m["compiler"] == "fake" and m["build_seconds"] >= 0 and "created" in m
    manifest = json.loads((entry / "manifest.json").read_text())
    assert set(manifest["files"]) == {"kernel.so", "kernel.cu", "build.ninja", "meta.json"}
    assert manifest["files"]["kernel.so"]["size"] == len(b"\x7fELF fake kernel")
    assert os.listdir(root / "tmp") == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("attngen: building causal bf16 hd128 sm_90a ... ") and err.rstrip().endswith(" s")

    # A second cache object (new process, in effect) hits on disk: no build, no output.
    p2 = ArtifactCache(root, prebuilt=None).get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count))
    assert p2 == p and builds(count) == 1
    assert capsys.readouterr().err == ""


def test_failing_build_publishes_nothing_and_propagates(ac, root, tmp_path, capsys):
    key = fresh_key("fail")

    def bad(tmp):
        (tmp / "kernel.so").write_bytes(b"half")
        raise RuntimeError("nvcc exploded")

    with pytest.raises(RuntimeError, match="nvcc exploded"):
        ac.get_or_build(key, "bad", bad)
    assert "failed" in capsys.readouterr().err
    assert os.listdir(root / "entries") == [] and os.listdir(root / "tmp") == []
    count = tmp_path / "count"
    assert ac.get_or_build(key, "bad", make_build(count)).read_bytes() == b"\x7fELF fake kernel"


def test_build_without_artifact_is_an_error(ac, root):
    from attngen.errors import BuildError

    with pytest.raises(BuildError, match="without producing 'kernel.so'"):
        ac.get_or_build(fresh_key("noart"), "noart", lambda tmp: (tmp / "other.so").write_bytes(b"x") and None)
    assert os.listdir(root / "entries") == []


def test_memo_hit_does_not_touch_disk(ac, tmp_path, monkeypatch):
    count = tmp_path / "count"
    key = fresh_key("memo")
    p = ac.get_or_build(key, "memo", make_build(count))

    def boom(*a, **k):
        raise AssertionError("memo hit touched the filesystem")

    import fcntl

    for mod, attr in [(os, "stat"), (os, "lstat"), (os, "open"), (os, "listdir"), (os, "scandir"),
                      (os.path, "lexists"), (fcntl, "flock")]:
        monkeypatch.setattr(mod, attr, boom)
    monkeypatch.setattr("builtins.open", boom)
    # what makes a hit cheap: one dict lookup, never the lookup/validate/lock/build path
    monkeypatch.setattr(ArtifactCache, "_lookup_or_build", boom)
    n = 20000
    for _ in range(n):
        assert ac.get_or_build(key, "memo", make_build(count)) is p
    monkeypatch.undo()
    assert builds(count) == 1


# ------------------------------------------------------------------------------------- concurrency


def test_four_processes_one_build(root, tmp_path):
    key = fresh_key("race")
    count = tmp_path / "count"
    go = tmp_path / "go"
    readies = [tmp_path / f"ready{i}" for i in range(4)]
    procs = [spawn(root, key, count, 1.0, r, str(go)) for r in readies]
    try:
        wait_for(lambda: all(r.exists() for r in readies), what="children to start")
        go.write_text("go")
        outs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    assert builds(count) == 1
    paths = {out.splitlines()[0] for out, _ in outs}
    contents = {out.splitlines()[1] for out, _ in outs}
    assert len(paths) == 1 and len(contents) == 1
    assert contents.pop().startswith("\x7fELF built by ")
    assert sum("building child kernel" in err for _, err in outs) == 1  # quiet on hits
    assert os.listdir(root / "tmp") == []


def test_killed_build_leaves_no_half_entry_and_next_call_rebuilds(root, tmp_path):
    key = fresh_key("killed")
    count = tmp_path / "count"
    proc = spawn(root, key, count, 60.0, tmp_path / "ready", "-")
    try:
        started = Path(str(count) + ".started")
        wait_for(started.exists, what="child build to start")
        tmpdir = Path(started.read_text())
        assert tmpdir.exists() and (tmpdir / "kernel.so").read_bytes() == b"partial"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    ac = ArtifactCache(root, prebuilt=None)
    assert os.listdir(root / "entries") == [] and ac.list_entries() == []
    assert tmpdir.exists()  # the killed build's leftovers, not visible as an entry

    p = ac.get_or_build(key, "child kernel", make_build(count))
    assert p.read_bytes() == b"\x7fELF fake kernel"
    assert builds(count) == 2
    assert not tmpdir.exists()  # stale temp dir cleaned: its lock was free
    assert os.listdir(root / "tmp") == []
    assert [e.key for e in ac.list_entries()] == [key]


def test_running_build_tmp_dir_is_not_cleaned_by_others(root, tmp_path):
    key = fresh_key("busy")
    count = tmp_path / "count"
    release = tmp_path / "release"  # the child's build holds until we have looked (30 s at most)
    proc = spawn(root, key, count, 30.0, tmp_path / "ready", "-", str(release))
    try:
        started = Path(str(count) + ".started")
        wait_for(started.exists, what="child build to start")
        tmpdir = Path(started.read_text())
        ac = ArtifactCache(root, prebuilt=None)
        ac.get_or_build(fresh_key("other"), "other", make_build(tmp_path / "count2"))  # runs cleanup
        assert tmpdir.exists()
        assert proc.poll() is None, "the child's build ended before the cleanup ran: nothing was tested"
        release.write_text("1")
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
    assert builds(count) == 1


# -------------------------------------------------------------------------------------- validation


def _entry_of(ac, key):
    (e,) = [e for e in ac.list_entries() if e.key == key]
    return e.path


@pytest.mark.parametrize("damage", ["flip", "truncate", "no_manifest", "bad_manifest", "missing_source"])
def test_corrupt_entry_is_rebuilt_with_warning(root, tmp_path, damage):
    key = fresh_key("corrupt")
    count = tmp_path / "count"
    ArtifactCache(root, prebuilt=None).get_or_build(key, "k", make_build(count))
    entry = _entry_of(ArtifactCache(root, prebuilt=None), key)
    so = entry / "kernel.so"
    if damage == "flip":  # same size, different bytes: only sha256 catches it
        data = bytearray(so.read_bytes())
        data[0] ^= 0xFF
        so.write_bytes(bytes(data))
        reason = "sha256"
    elif damage == "truncate":
        so.write_bytes(so.read_bytes()[:3])
        reason = "bytes"
    elif damage == "no_manifest":
        (entry / "manifest.json").unlink()
        reason = "manifest.json is missing"
    elif damage == "bad_manifest":
        (entry / "manifest.json").write_text("{not json")
        reason = "unreadable"
    else:
        (entry / "kernel.cu").unlink()
        reason = "kernel.cu is missing"
    fresh = ArtifactCache(root, prebuilt=None)  # new memo, as in a new process
    with pytest.warns(CacheWarning, match=reason):
        p = fresh.get_or_build(key, "k", make_build(count))
    assert p.read_bytes() == b"\x7fELF fake kernel"
    assert builds(count) == 2
    assert os.listdir(root / "tmp") == []
    assert len(os.listdir(root / "entries")) == 1


# ------------------------------------------------------------------------------------------ safety


def test_world_writable_root_is_refused(root, tmp_path):
    root.mkdir(mode=0o700)
    os.chmod(root, 0o777)
    with pytest.raises(CacheError) as ei:
        ArtifactCache(root, prebuilt=None).get_or_build(fresh_key("perm"), "k", make_build(tmp_path / "c"))
    msg = str(ei.value)
    assert str(root) in msg and "writable by group/others" in msg and "chmod go-w" in msg
    assert "ATTNGEN_CACHE_DIR" in msg


@pytest.mark.parametrize("target", ["entry", "artifact"])
def test_writable_entry_or_file_is_refused(root, tmp_path, target):
    key = fresh_key("perm-entry")
    count = tmp_path / "count"
    p = ArtifactCache(root, prebuilt=None).get_or_build(key, "k", make_build(count))
    victim = p.parent if target == "entry" else p
    os.chmod(victim, 0o777)
    with pytest.raises(CacheError, match=r"writable by group/others.*chmod go-w") as ei:
        ArtifactCache(root, prebuilt=None).get_or_build(key, "k", make_build(count))
    assert str(victim) in str(ei.value)
    assert builds(count) == 1


def test_foreign_owner_is_refused(root, tmp_path, monkeypatch):
    ac = ArtifactCache(root, prebuilt=None)
    ac.root  # create it while we still are ourselves
    monkeypatch.setattr(os, "geteuid", lambda: 12345)
    with pytest.raises(CacheError, match="not by you.*ATTNGEN_CACHE_DIR"):
        ArtifactCache(root, prebuilt=None).get_or_build(fresh_key("owner"), "k", make_build(tmp_path / "c"))


def test_published_files_are_not_group_writable(ac, tmp_path):
    old = os.umask(0o002)  # user-private-group umask: files come out 0664
    try:
        p = ac.get_or_build(fresh_key("umask"), "k", make_build(tmp_path / "c"))
    finally:
        os.umask(old)
    for f in p.parent.iterdir():
        assert not f.stat().st_mode & 0o022, f
    assert stat.S_IMODE(p.parent.stat().st_mode) == 0o700


def test_unusable_root_falls_back_to_a_persistent_private_root(tmp_path):
    blocker = tmp_path / "regular-file"
    blocker.write_text("not a directory")
    bad = blocker / "cache"  # cannot be created, even by root
    fb = tmp_path / "fallback"
    ac = ArtifactCache(bad, prebuilt=None, fallback=[blocker / "also-bad", fb])
    with pytest.warns(CacheWarning, match=rf"cannot be used.*new builds go to {fb}.*ATTNGEN_CACHE_DIR"):
        p = ac.get_or_build(fresh_key("fallback"), "k", make_build(tmp_path / "c"))
    assert p.read_bytes() == b"\x7fELF fake kernel"
    assert ac.root == fb and p.parent.parent == fb / "entries"
    assert stat.S_IMODE(ac.root.stat().st_mode) == 0o700
    del ac
    assert p.is_file()  # not a temporary directory removed at exit


def test_env_var_relocates_default_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert cache.cache_root() == tmp_path / "elsewhere"
    assert cache.default_cache() is cache.default_cache()
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "third"))
    assert cache.cache_root() == tmp_path / "third"


def test_verbose_flag(monkeypatch, capsys):
    monkeypatch.setenv("ATTNGEN_VERBOSE", "0")
    assert not cache.verbose()
    cache.vlog("hidden")
    monkeypatch.setenv("ATTNGEN_VERBOSE", "1")
    assert cache.verbose()
    cache.vlog("nvcc -O3 kernel.cu")
    assert capsys.readouterr().err == "attngen: nvcc -O3 kernel.cu\n"


# ---------------------------------------------------------------------------------------- prebuilt


def test_prebuilt_entry_is_used_without_building(tmp_path, root):
    key = fresh_key("prebuilt")
    src = ArtifactCache(tmp_path / "packager", prebuilt=None)
    p = src.get_or_build(key, "shipped", make_build(tmp_path / "c0"))
    pre = tmp_path / "prebuilt"
    pre.mkdir()
    import shutil

    shutil.copytree(p.parent, pre / p.parent.name)
    count = tmp_path / "count"
    got = ArtifactCache(root, prebuilt=pre).get_or_build(key, "shipped", make_build(count))
    assert got == pre / p.parent.name / "kernel.so"
    assert builds(count) == 0
    (pre / p.parent.name / "kernel.so").write_bytes(b"tampered kernel!")  # corrupt prebuilt: skip, build
    with pytest.warns(CacheWarning, match="prebuilt"):
        got = ArtifactCache(root, prebuilt=pre).get_or_build(key, "shipped", make_build(count))
    assert got.parent.parent == root / "entries" and builds(count) == 1


# -------------------------------------------------------------------------------------- management


def test_list_info_clear_and_cli(ac, root, tmp_path, capsys):
    k1, k2 = fresh_key("one"), fresh_key("two")
    ac.get_or_build(k1, "causal bf16 hd128 sm_90a", make_build(tmp_path / "c"), {"fields": {"n": 1}})
    ac.get_or_build(k2, "alibi fp16 hd64 sm_80", make_build(tmp_path / "c"))
    capsys.readouterr()
    es = ac.list_entries()
    assert {e.key for e in es} == {k1, k2}
    assert {e.name for e in es} == {"causal bf16 hd128 sm_90a", "alibi fp16 hd64 sm_80"}
    assert all(e.size > 0 and e.created > 0 for e in es)
    meta = ac.info(k1[:10])
    assert meta["key"] == k1 and meta["fields"] == {"n": 1} and "kernel.so" in meta["files"]
    with pytest.raises(CacheError, match="no entry matches"):
        ac.info("zzzz")

    from attngen.cache.cli import main

    assert main(["ls"], cache=ac) == 0
    out = capsys.readouterr().out
    assert "causal bf16 hd128 sm_90a" in out and k2[:16] in out and "2 entries" in out
    assert main(["info", k2[:12]], cache=ac) == 0
    assert json.loads(capsys.readouterr().out)["key"] == k2
    assert main(["info", "nope"], cache=ac) == 1
    assert main(["clear"], cache=ac) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert ac.list_entries() == [] and os.listdir(root / "tmp") == []
    # memo was dropped with the entries: the next call rebuilds
    count = tmp_path / "after"
    ac.get_or_build(k1, "causal bf16 hd128 sm_90a", make_build(count))
    assert builds(count) == 1


def test_threads_share_one_build(ac, tmp_path):
    import threading

    key = fresh_key("threads")
    count = tmp_path / "count"
    results = []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        results.append(ac.get_or_build(key, "threads", make_build(count, sleep=0.2)))

    ts = [threading.Thread(target=worker) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=20)
    assert len(results) == 8 and len(set(results)) == 1
    assert builds(count) == 1
