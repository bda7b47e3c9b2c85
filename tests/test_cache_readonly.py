"""Read-only caches: lookups that never write, builds that go to a writable root, entries that hold regular files
only (docs/cache.md, "Read-only and shared caches").

The tests may run as root, where chmod does not stop writes: they count write calls instead of trusting
permissions (the directories are chmod'ed read-only as well, which matters for everyone else).
"""

from __future__ import annotations

import builtins
import io
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from attngen.cache import ArtifactCache, CacheError, CacheWarning, cache_key

FIELDS = {"variant": "causal", "dtype": "bf16", "head_dim": 128, "arch": "sm_90a"}


def fresh_key(tag: str) -> str:
    return cache_key({**FIELDS, "tag": tag, "nonce": os.urandom(8).hex()})


def make_build(count: list):
    def build(tmp: Path):
        count.append(1)
        (tmp / "kernel.cu").write_text("// generated\n")
        (tmp / "kernel.so").write_bytes(b"\x7fELF fake kernel")
        return {"compiler": "fake"}

    return build


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class WriteCounter:
    """Records every filesystem-modifying call (path, operation) made while installed."""

    def __init__(self, monkeypatch):
        self.calls: list[tuple[str, str]] = []
        real_open, real_os_open = builtins.open, os.open

        def opener(file, mode="r", *a, **k):
            if isinstance(file, (str, bytes, os.PathLike)) and any(c in mode for c in "wax+"):
                self.calls.append((os.fspath(file), f"open({mode!r})"))
            return real_open(file, mode, *a, **k)

        def os_opener(path, flags, *a, **k):
            if flags & _WRITE_FLAGS:
                self.calls.append((os.fspath(path), "os.open(write)"))
            return real_os_open(path, flags, *a, **k)

        monkeypatch.setattr(builtins, "open", opener)
        monkeypatch.setattr(io, "open", opener)
        monkeypatch.setattr(os, "open", os_opener)
        for mod, names in [(os, ["mkdir", "makedirs", "rename", "replace", "unlink", "remove", "rmdir", "chmod",
                                 "symlink", "link", "utime", "truncate"]),
                           (tempfile, ["mkdtemp", "mkstemp"]), (shutil, ["rmtree", "copy2", "copytree"])]:
            for name in names:
                monkeypatch.setattr(mod, name, self._wrap(getattr(mod, name), f"{mod.__name__}.{name}"))

    def _wrap(self, fn, label):
        def wrapped(*args, **kwargs):
            target = args[0] if args else kwargs.get("dir", kwargs.get("path", "?"))
            self.calls.append((os.fspath(target) if isinstance(target, (str, os.PathLike)) else str(target), label))
            return fn(*args, **kwargs)

        return wrapped

    def under(self, d: Path) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] == str(d) or c[0].startswith(str(d) + os.sep)]


def _chmod_tree(d: Path, writable: bool) -> None:
    for dirpath, dirnames, filenames in os.walk(d):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644 if writable else 0o444)
        os.chmod(dirpath, 0o755 if writable else 0o555)


@pytest.fixture
def shared(tmp_path):
    """A cache with one built entry, then made read-only (restored at teardown so tmp_path can be removed)."""
    d = tmp_path / "shared"
    key = fresh_key("shared")
    count: list = []
    so = ArtifactCache(d, prebuilt=None, readonly=()).get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count))
    assert count == [1] and so.is_file()
    _chmod_tree(d, writable=False)
    yield d, key, so
    _chmod_tree(d, writable=True)


def test_readonly_root_hit_makes_zero_writes(shared, tmp_path, monkeypatch):
    d, key, so = shared
    count: list = []
    ac = ArtifactCache(tmp_path / "mine", prebuilt=None, readonly=[d], fallback=[tmp_path / "fb"])
    w = WriteCounter(monkeypatch)
    got = ac.get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count))
    monkeypatch.undo()
    assert got == so and count == []
    assert w.calls == []  # not in the read-only root, and not anywhere else either
    assert not (tmp_path / "mine").exists() and not (tmp_path / "fb").exists()


def test_readonly_env_var_is_looked_up_first(shared, tmp_path, monkeypatch, capsys):
    d, key, so = shared
    # the user cache holds the same key too: the read-only root must win, not be the only place it exists
    user_so = ArtifactCache(tmp_path / "user", prebuilt=None, readonly=()).get_or_build(key, "causal bf16 hd128 sm_90a",
                                                                                       make_build([]))
    assert user_so != so
    capsys.readouterr()  # that build's log line
    monkeypatch.setenv("ATTNGEN_CACHE_READONLY", f"{tmp_path / 'absent'}{os.pathsep}{d}")
    monkeypatch.setenv("ATTNGEN_CACHE_DIR", str(tmp_path / "user"))
    import attngen.cache as cache

    count: list = []
    w = WriteCounter(monkeypatch)
    got = cache.get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count))
    calls = list(w.calls)
    monkeypatch.undo()
    assert got == so and count == [] and calls == []
    assert capsys.readouterr().err == ""


def test_readonly_user_cache_serves_hits_and_builds_elsewhere(shared, tmp_path, monkeypatch, capsys):
    d, key, so = shared
    real_access = os.access
    # chmod does not stop root: tell the cache the directory is read-only the way a read-only mount would
    monkeypatch.setattr(os, "access", lambda p, m, **k: False if Path(p) == d else real_access(p, m, **k))
    fb = tmp_path / "fallback"
    ac = ArtifactCache(d, prebuilt=None, readonly=(), fallback=[fb])
    count: list = []
    w = WriteCounter(monkeypatch)
    assert ac.get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count)) == so  # hit: no writes at all
    assert w.calls == [] and not fb.exists()

    other = fresh_key("miss")
    p = ac.get_or_build(other, "sliding bf16 hd128 sm_90a", make_build(count))
    assert count == [1] and w.under(d) == []  # the build wrote only into the fallback
    err = capsys.readouterr().err
    assert err.count(f"{d} is read-only") == 1 and str(fb) in err and "ATTNGEN_CACHE_READONLY" in err
    monkeypatch.undo()
    assert p.parent.parent == fb / "entries" and p.is_file()
    del ac  # the fallback persists: the path printed by `attngen compile` stays valid
    assert p.is_file() and stat.S_IMODE(fb.stat().st_mode) == 0o700

    # a new process finds both: the shared entry in place, the fallback's build without rebuilding
    monkeypatch.setattr(os, "access", lambda p_, m, **k: False if Path(p_) == d else real_access(p_, m, **k))
    ac2 = ArtifactCache(d, prebuilt=None, readonly=(), fallback=[fb])
    assert ac2.get_or_build(other, "sliding bf16 hd128 sm_90a", make_build(count)) == p
    assert ac2.get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count)) == so
    assert count == [1]
    assert sorted((e.key, e.source) for e in ac2.list_entries()) == sorted([(key, "read-only"), (other, "user")])


def test_readonly_root_owned_by_someone_else_serves_but_as_user_cache_is_refused(shared, tmp_path, monkeypatch):
    d, key, so = shared
    monkeypatch.setattr(os, "geteuid", lambda: 54321)  # the entries now belong to "another user"
    count: list = []
    got = ArtifactCache(tmp_path / "mine", prebuilt=None, readonly=[d]).get_or_build(key, "k", make_build(count))
    assert got == so and count == []  # you listed it, so its owner is trusted
    with pytest.raises(CacheError, match=r"not by you.*ATTNGEN_CACHE_READONLY"):
        ArtifactCache(d, prebuilt=None, readonly=()).get_or_build(key, "k", make_build(count))


@pytest.mark.parametrize("where", ["root", "entries", "files"])
def test_unsafe_readonly_root_is_skipped_with_one_warning(shared, tmp_path, where):
    """A root installed with umask 002 (files 0664) serves nothing but breaks no lookup: skipped like a corrupt one."""
    d, key, so = shared
    if where == "files":
        for f in so.parent.iterdir():
            os.chmod(f, 0o664)
    else:
        os.chmod(d if where == "root" else d / "entries", 0o775)
    count: list = []
    ac = ArtifactCache(tmp_path / "mine", prebuilt=None, readonly=[d])
    with pytest.warns(CacheWarning, match=rf"ignoring the read-only kernel root {d}: .*writable by group/others.*"
                                          rf"chmod -R go-w {d}") as rec:
        p = ac.get_or_build(key, "k", make_build(count))
        ac.forget()
        ac.get_or_build(key, "k", make_build(count))
        assert ac.list_entries()
    assert count == [1] and p.parent.parent == tmp_path / "mine" / "entries"
    assert len([w for w in rec if issubclass(w.category, CacheWarning)]) == 1


@pytest.mark.parametrize("what", ["file", "dir", "unlisted"])
def test_symlink_or_unlisted_file_in_entry_is_refused(tmp_path, what):
    root = tmp_path / "cache"
    key = fresh_key("symlink")
    count: list = []
    so = ArtifactCache(root, prebuilt=None, readonly=()).get_or_build(key, "k", make_build(count))
    entry = so.parent
    if what == "file":
        os.symlink("/etc/hostname", entry / "extra.so")
        reason = "extra.so is a symlink"
    elif what == "dir":
        os.symlink(tmp_path, entry / "include")
        reason = "include is a symlink"
    else:
        (entry / "planted.so").write_bytes(b"not in the manifest")
        reason = "planted.so is not listed in the manifest"
    # in a read-only root: skipped with a warning, the kernel is built in the user cache
    mine = tmp_path / "mine"
    with pytest.warns(CacheWarning, match=reason):
        p = ArtifactCache(mine, prebuilt=None, readonly=[root]).get_or_build(key, "k", make_build(count))
    assert p.parent.parent == mine / "entries" and count == [1, 1]
    # in the user cache: removed and rebuilt
    with pytest.warns(CacheWarning, match=reason):
        p = ArtifactCache(root, prebuilt=None, readonly=()).get_or_build(key, "k", make_build(count))
    assert count == [1, 1, 1] and p.read_bytes() == b"\x7fELF fake kernel"
    assert sorted(os.listdir(p.parent)) == ["kernel.cu", "kernel.so", "manifest.json", "meta.json"]


def test_cache_write_failure_is_a_cache_error(tmp_path, monkeypatch):
    def denied(*a, **k):
        raise PermissionError(13, "Permission denied", str(tmp_path / "cache" / "tmp"))

    ac = ArtifactCache(tmp_path / "cache", prebuilt=None, readonly=())
    ac.root
    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    with pytest.raises(CacheError, match=r"cannot write .*/tmp \(Permission denied\).*ATTNGEN_CACHE_DIR") as ei:
        ac.get_or_build(fresh_key("denied"), "k", make_build([]))
    assert "\n" not in str(ei.value)


def test_no_writable_root_at_all_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    ac = ArtifactCache(blocker / "a", prebuilt=None, readonly=(), fallback=[blocker / "b"])
    with pytest.raises(CacheError, match=r"no writable cache directory.*Fix: set ATTNGEN_CACHE_DIR"):
        ac.get_or_build(fresh_key("nowhere"), "k", make_build([]))


def test_cache_ls_shows_readonly_entries_and_path_prints_the_build_root(shared, tmp_path, capsys):
    from attngen.cache.cli import main

    d, key, so = shared
    ac = ArtifactCache(tmp_path / "mine", prebuilt=None, readonly=[d])
    assert main(["ls"], cache=ac) == 0
    out = capsys.readouterr().out
    assert key[:16] in out and "read-only" in out and str(d / "entries") in out
    assert main(["path"], cache=ac) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "mine")
    assert main(["clear"], cache=ac) == 0
    assert so.is_file()  # read-only roots are never cleared


def test_build_function_errors_pass_through_unchanged(tmp_path):
    def build(tmp):
        raise FileNotFoundError(2, "No such file or directory", "nvcc")

    with pytest.raises(FileNotFoundError):
        ArtifactCache(tmp_path / "c", prebuilt=None, readonly=()).get_or_build(fresh_key("oserr"), "k", build)


def test_root_without_owner_write_bit_is_read_only_even_for_root(shared, tmp_path, capsys):
    """os.access is always true for root: the mode bits decide. Nothing in a read-only root is written or deleted."""
    d, key, so = shared
    fb = tmp_path / "fb"
    so.write_bytes(so.read_bytes() + b"!")  # corrupt (root may write a 0444 file; others get a read-only root)
    count: list = []
    ac = ArtifactCache(d, prebuilt=None, readonly=(), fallback=[fb])
    with pytest.warns(CacheWarning, match="unusable"):
        p = ac.get_or_build(key, "causal bf16 hd128 sm_90a", make_build(count))
    assert count == [1] and p.parent.parent == fb / "entries"
    assert ac.clear() == 1
    assert so.is_file() and so.read_bytes().endswith(b"!")  # skipped, never removed or cleared


def test_cache_ls_and_path_create_nothing_and_log_nothing(shared, tmp_path, monkeypatch, capsys):
    from attngen.cache.cli import main

    d, key, so = shared
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m, **k: False if Path(p) == d else real_access(p, m, **k))
    fresh = ArtifactCache(tmp_path / "new" / "root", prebuilt=None, readonly=(), fallback=[tmp_path / "fb0"])
    readonly_user = ArtifactCache(d, prebuilt=None, readonly=(), fallback=[tmp_path / "fb"])
    w = WriteCounter(monkeypatch)
    assert main(["path"], cache=fresh) == 0 and main(["ls"], cache=fresh) == 0
    assert main(["path"], cache=readonly_user) == 0 and main(["ls"], cache=readonly_user) == 0
    calls = list(w.calls)
    monkeypatch.undo()
    out, err = capsys.readouterr()
    assert calls == [] and err == ""
    assert out.splitlines()[0] == str(tmp_path / "new" / "root") and f"new builds go to {tmp_path / 'fb'}" in out
    assert not (tmp_path / "new").exists() and not (tmp_path / "fb").exists()


def test_no_home_warning_names_no_none(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTNGEN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    ac = ArtifactCache(prebuilt=None, readonly=(), fallback=[tmp_path / "fb"])
    with pytest.warns(CacheWarning) as rec:
        assert ac.root == tmp_path / "fb"
    msg = str(rec[0].message)
    assert "None" not in msg and "~/.cache/attngen" in msg and "set HOME" in msg


def test_symlink_alias_of_the_user_cache_listed_read_only_is_never_cleared(tmp_path):
    user = tmp_path / "user"
    key = fresh_key("alias")
    so = ArtifactCache(user, prebuilt=None, readonly=()).get_or_build(key, "k", make_build([]))
    os.symlink(user, tmp_path / "alias")
    count: list = []
    ac = ArtifactCache(user, prebuilt=None, readonly=[tmp_path / "alias"], fallback=[tmp_path / "fb"])
    assert ac.get_or_build(key, "k", make_build(count)) == so and count == []
    assert ac.clear() == 0 and so.is_file()
    assert ac.root == tmp_path / "fb"
