"""The on-disk per-signature artifact cache (one directory per compiled kernel).

Layout under the root ($ATTNGEN_CACHE_DIR, else $XDG_CACHE_HOME/attngen, else ~/.cache/attngen):

    entries/<readable-name>-<key[:16]>/   published entries: sources, build.ninja, kernel.so, meta.json,
                                          manifest.json (sha256 + size of every other file, written last)
    locks/<key[:16]>.lock                 flock(2) target, one per entry; never deleted
    tmp/<key[:16]>.<pid>.<random>/        builds in progress (renamed into entries/ when complete)

Lookup: in-process memo -> read-only roots ($ATTNGEN_CACHE_READONLY, then the package's attngen/prebuilt/ and
the attngen_kernels package) -> the user cache -> build under the lock. A root holding prebuilt.json (made by
`python -m attngen prebuild`) records the toolchain its entries were built with ("pins"); its entries are looked
up under the key computed with those values (`key_for`), so a machine without nvcc finds them. Lookups only read: a read-only user cache (a shared filesystem) serves
its entries as they are, and builds then go to a writable fallback root (logged once). An entry is visible
only after os.rename of a complete directory, so a killed build never leaves a half entry; its tmp dir is
removed by a later build once nobody holds that entry's lock (the kernel drops flock locks of dead processes,
SIGKILL included).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

try:
    import fcntl
except ImportError:  # pragma: no cover - attngen targets Linux; the cache then runs without locks
    fcntl = None  # type: ignore[assignment]

from attngen.errors import BuildError, CacheError

__all__ = [
    "ArtifactCache",
    "CacheEntry",
    "CacheWarning",
    "default_cache",
    "default_cache_dir",
    "readonly_cache_dirs",
    "cache_root",
    "get_or_build",
    "list_entries",
    "clear",
    "info",
    "verbose",
    "log",
    "vlog",
    "write_if_different",
    "write_manifest",
    "MANIFEST_NAME",
    "META_NAME",
    "PREBUILT_MANIFEST",
    "KERNELS_PACKAGE",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
META_NAME = "meta.json"
_RESERVED = (MANIFEST_NAME, META_NAME)
_KEY_RE = re.compile(r"^[0-9a-f]{16,128}$")
_K16_RE = re.compile(r"^[0-9a-f]{16}$")
_STALE_SECONDS_WITHOUT_LOCKS = 3600.0
_PREBUILT_DIR = Path(__file__).resolve().parent.parent / "prebuilt"
PREBUILT_MANIFEST = "prebuilt.json"  # a prebuilt root's manifest: its pins, versions and entries (prebuild.py)
KERNELS_PACKAGE = "attngen_kernels"  # the package the attngen-kernels wheel installs: a prebuilt root
_META_PROTECTED = ("format", "name", "key", "artifact", "created", "created_unix")
READONLY_ENV = "ATTNGEN_CACHE_READONLY"


class CacheWarning(UserWarning):
    """The cache recovered from a problem (corrupt entry rebuilt or skipped, unusable root replaced)."""


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One published entry, as listed by `ArtifactCache.list_entries`."""

    name: str  # readable name given by the build layer, e.g. "causal bf16 hd128 sm_90a"
    key: str  # full cache key ("" if the entry's meta.json/manifest.json is unreadable)
    size: int  # bytes, all files
    created: float  # unix time
    path: Path  # the entry directory
    artifact: str | None  # file name of the artifact inside the entry
    source: str = "user"  # "user" (the writable cache), "read-only" ($ATTNGEN_CACHE_READONLY or a read-only
    #                       user cache) or "prebuilt" (shipped in the package)


# ----------------------------------------------------------------------------------------------- logging


def verbose() -> bool:
    """True when ATTNGEN_VERBOSE is set to something other than '', 0, false, no, off."""
    return os.environ.get("ATTNGEN_VERBOSE", "").strip().lower() not in ("", "0", "false", "no", "off")


def log(msg: str) -> None:
    """One line on stderr, prefixed 'attngen: '."""
    sys.stderr.write(f"attngen: {msg}\n")
    sys.stderr.flush()


def vlog(msg: str) -> None:
    """`log` only when `verbose()`; the build layer prints nvcc command lines through this."""
    if verbose():
        log(msg)


# ------------------------------------------------------------------------------------------- file helpers


def write_if_different(path: str | os.PathLike, text: str | bytes, *, encoding: str = "utf-8") -> bool:
    """Write `text` to `path` unless it already holds exactly that; True if it wrote.

    Unchanged files keep their mtime, so ninja does not rebuild from regenerated-but-identical sources.
    The write goes through a temporary file and os.replace, so readers never see a partial file.
    """
    path = Path(path)
    data = text.encode(encoding) if isinstance(text, str) else bytes(text)
    try:
        if path.stat().st_size == len(data) and path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _slug(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9.+_-]+", "_", name).strip("._-")
    return s[:80] or "entry"


def _check_owner_and_mode(path: Path, st: os.stat_result, what: str, *, trusted: frozenset[int] | None = None) -> None:
    """Refuse paths another user could have written: loading a cached library runs its code.

    `trusted`: the uids allowed to own `path` (default: only you). Group/other-writable is refused always.
    """
    uid = os.geteuid()
    allowed = trusted if trusted is not None else frozenset((uid,))
    if st.st_uid not in allowed:
        raise CacheError(
            f"attngen cache {what} {path} is owned by uid {st.st_uid}, not by you (uid {uid}); loading kernels "
            f"from it would run code another user controls. Fix: set ATTNGEN_CACHE_DIR to a directory you own "
            f"(to use kernels someone else built, list their cache in {READONLY_ENV}), or remove {path}."
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(
            f"attngen cache {what} {path} is writable by group/others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"another user could replace the kernels in it. Fix: `chmod go-w {path}`, or set ATTNGEN_CACHE_DIR "
            f"to a private directory."
        )


def _writable_dir(path: Path) -> bool:
    """Whether `path` is a directory this process may write, by its mode too: for root os.access is always true,
    so a root whose owner-write bit is clear counts as read-only (a read-only mount or `chmod a-w`)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_IWUSR) and os.access(path, os.W_OK | os.X_OK)


def _resolved(path: Path) -> Path:
    """`path` with symlinks resolved, so two spellings of one directory compare equal."""
    return Path(os.path.realpath(path))


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.unlink(path)  # a symlink or file where a directory was expected


def write_manifest(entry: Path, key: str, artifact: str, name: str) -> None:
    """Drop group/other write bits in `entry` and write its manifest.json (size + sha256 of every other file).
    The build's last step; also reseals an entry whose files a tool changed on purpose (prebuild strips)."""
    files: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(entry):
        dpath = Path(dirpath)
        for d in dirnames:
            dp = dpath / d
            if dp.is_symlink():
                raise BuildError(
                    f"attngen cache: the build of {name} created the symlink {dp}; entries hold regular "
                    f"files only. Fix: copy the target instead."
                )
            os.chmod(dp, stat.S_IMODE(os.lstat(dp).st_mode) & ~0o022)
        for f in filenames:
            fp = dpath / f
            st = os.lstat(fp)
            if not stat.S_ISREG(st.st_mode):
                raise BuildError(
                    f"attngen cache: the build of {name} created {fp}, which is not a regular file "
                    f"(symlink, socket, ...). Fix: write regular files only."
                )
            os.chmod(fp, stat.S_IMODE(st.st_mode) & ~0o022)
            rel = fp.relative_to(entry).as_posix()
            if rel != MANIFEST_NAME:
                files[rel] = {"size": st.st_size, "sha256": _sha256_file(fp)}
    manifest = {"format": FORMAT_VERSION, "key": key, "artifact": artifact, "files": dict(sorted(files.items()))}
    (entry / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.chmod(entry / MANIFEST_NAME, 0o644)  # independent of the umask, like the files above


# ------------------------------------------------------------------------------------------------ roots


def default_cache_dir() -> Path:
    """The configured root (not yet created): $ATTNGEN_CACHE_DIR, $XDG_CACHE_HOME/attngen, ~/.cache/attngen."""
    env = os.environ.get("ATTNGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser().absolute()
    return _home_cache_dir()


def _home_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return (base / "attngen").absolute()


def readonly_cache_dirs() -> list[Path]:
    """$ATTNGEN_CACHE_READONLY split on ':' (os.pathsep): roots looked up before the user cache, never written."""
    raw = os.environ.get(READONLY_ENV, "")
    return [Path(p).expanduser().absolute() for p in raw.split(os.pathsep) if p.strip()]


def _default_fallback_roots(requested: Path | None) -> list[Path]:
    """Where builds go when the configured root cannot be written: the usual per-user cache (when
    ATTNGEN_CACHE_DIR pointed elsewhere), then <tmp>/attngen-cache-<uid>. Both persist across processes."""
    out: list[Path] = []
    with contextlib.suppress(RuntimeError):  # Path.home() without HOME or a passwd entry
        home = _home_cache_dir()
        if home != requested:
            out.append(home)
    out.append(Path(tempfile.gettempdir()) / f"attngen-cache-{os.geteuid()}")
    return out


_announced: set[str] = set()
_announce_lock = threading.Lock()


def _first_time(msg: str) -> bool:
    with _announce_lock:
        if msg in _announced:
            return False
        _announced.add(msg)
        return True


def _log_once(msg: str) -> None:
    if _first_time(msg):
        log(msg)


def _skip_unsafe_root(root: Path, err: CacheError) -> None:
    """One CacheWarning per process and root: an unsafe read-only or prebuilt root is skipped like a corrupt one
    (a wheel installed with umask 002 must not break every lookup)."""
    if _first_time(f"unsafe {root}"):
        why = str(err).split(" Fix:")[0].removeprefix("attngen cache ")
        warnings.warn(f"attngen: ignoring the read-only kernel root {root}: {why} Fix: `chmod -R go-w {root}` (and "
                      f"install packages with umask 022).", CacheWarning, stacklevel=6)


_local_pins: Callable[[], Mapping[str, Any] | None] | None = None


def register_local_pins(fn: Callable[[], Mapping[str, Any] | None]) -> None:
    """The build layer tells the store this machine's toolchain ({"nvcc": [13, 0]}, None without one), so a
    prebuilt root built with another CUDA major is skipped instead of loaded (jit/toolchain.py registers it)."""
    global _local_pins
    _local_pins = fn


@dataclasses.dataclass(frozen=True)
class _Source:
    """A directory of entries that lookups search: `entries` holds <name>-<key16>/ directories."""

    entries: Path
    kind: str  # "user" (the writable root: corrupt entries are replaced), "read-only", "prebuilt"
    trusted: frozenset[int]  # uids that may own what is inside
    pins: Mapping[str, Any] | None = None  # a prebuilt root's recorded toolchain (prebuilt.json); None: this machine's
    records: Mapping[str, Any] | None = None  # a prebuilt root's "records" (rel path -> sha256); None: not prebuilt

    @property
    def root(self) -> Path:
        """The root the entries belong to (analysis records live in <root>/analysis)."""
        return self.entries.parent if self.entries.name == "entries" else self.entries


def _read_prebuilt(root: Path, trusted: frozenset[int]) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """(pins, records) of root/prebuilt.json: the toolchain fields its entries were keyed with and the sha256 of
    each analysis record it ships; (None, None) without the file. CacheError when the file is unsafe; a damaged
    one pins nothing it could be trusted for: ({"unreadable": why}, {})."""
    path = root / PREBUILT_MANIFEST
    try:
        st = os.lstat(path)
    except OSError:
        return None, None
    _check_owner_and_mode(path, st, "file", trusted=trusted)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        pins, records = doc["pins"], doc.get("records", {})
        if not isinstance(pins, dict) or not isinstance(records, dict):
            raise TypeError("pins or records is not an object")
        return pins, records
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"unreadable": f"{PREBUILT_MANIFEST} is unreadable ({type(e).__name__}: {e})"}, {}


def _safe_source(root: Path, entries: Path, kind: str, trusted: frozenset[int]) -> _Source | None:
    """The _Source of a read-only or prebuilt root, or None (warned once) when something in it is unsafe."""
    try:
        _check_owner_and_mode(root, os.stat(root), "read-only root", trusted=trusted)
        if entries != root:
            _check_owner_and_mode(entries, os.stat(entries), "directory", trusted=trusted)
        pins, records = _read_prebuilt(root, trusted)
    except CacheError as e:
        _skip_unsafe_root(root, e)
        return None
    except OSError:
        return None
    return _Source(entries, kind, trusted, pins, records)


def _kernels_package_dir() -> Path | None:
    """Where the attngen-kernels wheel installed its prebuilt root (the attngen_kernels package), without importing
    it; None when it is not installed."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(KERNELS_PACKAGE)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


# ------------------------------------------------------------------------------------------------ cache


class ArtifactCache:
    """Per-signature build artifacts on disk, safe across threads and processes.

    `root=None` means `default_cache_dir()` at construction time. `prebuilt` is the directory of entries shipped
    with the package, or a list of such directories (default: attngen/prebuilt and the attngen_kernels package when
    installed; pass None to disable them); `readonly` the extra read-only roots looked up first (None:
    $ATTNGEN_CACHE_READONLY; each is a cache root with entries/, or a directory of entries). `fallback` lists
    where builds go when `root` cannot be written (None: the per-user defaults, see `_default_fallback_roots`).
    Nothing touches the disk until the first operation, and lookups never write.
    """

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        *,
        prebuilt: str | os.PathLike | Iterable[str | os.PathLike] | None = _PREBUILT_DIR,
        readonly: Iterable[str | os.PathLike] | None = None,
        fallback: Iterable[str | os.PathLike] | None = None,
    ):
        try:
            self._requested: Path | None = Path(root).expanduser().absolute() if root is not None else default_cache_dir()
        except RuntimeError:  # Path.home() without HOME or a passwd entry
            self._requested = None
        if prebuilt is None:
            self._prebuilt: tuple[Path, ...] | None = ()
        elif isinstance(prebuilt, (str, os.PathLike)):
            self._prebuilt = None if Path(prebuilt) == _PREBUILT_DIR else (Path(prebuilt),)  # None: found lazily
        else:
            self._prebuilt = tuple(Path(d) for d in prebuilt)
        ro = readonly_cache_dirs() if readonly is None else [Path(d).expanduser().absolute() for d in readonly]
        # Compared resolved: a root listed read-only under any spelling (a symlink alias) is never written or cleared.
        req = _resolved(self._requested) if self._requested is not None else None
        self._requested_readonly = req is not None and any(_resolved(d) == req for d in ro)
        self._readonly = tuple(d for d in ro if _resolved(d) != req)
        self._fallback = None if fallback is None else [Path(d).expanduser().absolute() for d in fallback]
        self._root: Path | None = None
        self._memo: dict[tuple[str, str], Path] = {}
        self._init_lock = threading.Lock()
        self._warned_no_flock = False
        self._warned: set[tuple[str, str]] = set()

    def __repr__(self) -> str:
        return f"ArtifactCache(root={str(self._root or self._requested)!r})"

    # ------------------------------------------------------------------------------------------ root

    @property
    def root(self) -> Path:
        """The writable root builds go to (created on first access). When the configured root cannot be
        written, a fallback root (logged once); CacheError if no candidate is writable."""
        root = self._root
        return root if root is not None else self._ensure_root()

    def _fallback_roots(self) -> list[Path]:
        cands = self._fallback if self._fallback is not None else _default_fallback_roots(self._requested)
        req = _resolved(self._requested) if self._requested is not None else None
        return [c for c in cands if _resolved(c) != req]

    def _ensure_root(self) -> Path:
        with self._init_lock:
            if self._root is not None:
                return self._root
            requested = self._requested
            try:
                if requested is None:
                    raise OSError("no home directory to put ~/.cache/attngen in")
                if self._requested_readonly:
                    raise PermissionError(errno.EACCES, f"listed in {READONLY_ENV}", str(requested))
                self._prepare_root(requested)
                root = requested
            except OSError as e:
                root = self._fallback_root(requested, e)
            self._root = root
            vlog(f"cache root {root}")
            return root

    def _fallback_root(self, requested: Path | None, err: OSError) -> Path:
        tried = []
        for cand in self._fallback_roots():
            try:
                self._prepare_root(cand)
            except (OSError, CacheError) as e:
                tried.append(f"{cand} ({getattr(e, 'strerror', None) or e})")
                continue
            why = err.strerror or str(err)
            if requested is not None and requested.is_dir():
                # A shared or packaged cache: its entries still serve (looked up read-only), builds go elsewhere.
                _log_once(
                    f"cache directory {requested} is read-only ({why}): kernels found there are used as they are, "
                    f"new builds go to {cand}. To choose where builds go, set ATTNGEN_CACHE_DIR to a writable "
                    f"directory and list {requested} in {READONLY_ENV}."
                )
            else:
                what = requested if requested is not None else "~/.cache/attngen"
                fix = f"make {requested} writable, or set" if requested is not None else "set HOME, or"
                warnings.warn(
                    f"attngen: cache directory {what} cannot be used ({why}); new builds go to {cand} "
                    f"instead. Fix: {fix} ATTNGEN_CACHE_DIR to a writable directory you own.",
                    CacheWarning,
                    stacklevel=5,
                )
            return cand
        raise CacheError(
            f"attngen cache: no writable cache directory: {requested or '~/.cache/attngen'} ({err.strerror or err}), "
            f"{', '.join(tried) or 'no fallback'}. Fix: set ATTNGEN_CACHE_DIR to a writable directory you own."
        )

    @staticmethod
    def _prepare_root(root: Path) -> None:
        """Create root and its subdirectories (mode 0700). OSError: unusable; CacheError: unsafe."""
        if not os.path.isdir(root):  # (makedirs on an existing root would still call mkdir there)
            os.makedirs(root, mode=0o700, exist_ok=True)
        _check_owner_and_mode(root, os.stat(root), "directory")
        if not _writable_dir(root):
            raise PermissionError(errno.EACCES, "not writable", str(root))
        for sub in ("entries", "locks", "tmp"):
            p = root / sub
            with contextlib.suppress(FileExistsError):
                os.mkdir(p, 0o700)
            st = os.lstat(p)
            if not stat.S_ISDIR(st.st_mode):
                raise CacheError(
                    f"attngen cache path {p} is not a directory. Fix: remove it (attngen recreates it), "
                    f"or set ATTNGEN_CACHE_DIR to another directory."
                )
            _check_owner_and_mode(p, st, "directory")
            if not st.st_mode & stat.S_IWUSR:
                raise PermissionError(errno.EACCES, "not writable", str(p))

    # --------------------------------------------------------------------------------------- sources

    def _sources(self) -> Iterator[_Source]:
        """The entry directories lookups search, in order; reads only (nothing is created). A generator, so a
        hit in an earlier source never looks at (or trips over) a later one. A read-only or prebuilt root holding
        something unsafe is skipped with one CacheWarning; an unsafe user cache is refused (CacheError)."""
        me = os.geteuid()
        for ro in self._readonly:
            try:
                owner = os.stat(ro).st_uid
            except OSError:
                continue  # a listed root that is absent serves nothing
            src = _safe_source(ro, ro / "entries" if os.path.isdir(ro / "entries") else ro, "read-only",
                               frozenset((me, 0, owner)))  # you listed it, so you trust its owner
            if src is not None:
                yield src
        for pre in self._prebuilt_dirs():
            if pre.is_dir():
                src = _safe_source(pre, pre / "entries" if os.path.isdir(pre / "entries") else pre, "prebuilt",
                                   frozenset((me, 0)))
                if src is not None:
                    yield src
        user_roots, writable = self._user_roots()
        for r in user_roots:
            if not os.path.isdir(r):
                continue
            entries = r / "entries"
            try:
                _check_owner_and_mode(r, os.stat(r), "directory")  # the root itself may be a symlink
                est = os.lstat(entries)
                if not stat.S_ISDIR(est.st_mode):
                    continue  # a build in this root repairs it (_prepare_root)
                _check_owner_and_mode(entries, est, "directory")
            except FileNotFoundError:
                continue
            except CacheError:
                if r in (self._root, self._requested):
                    raise
                continue  # an unsafe fallback candidate is skipped here, as when choosing where to build
            kind = "user" if r == writable else "read-only"
            yield _Source(entries, kind, frozenset((me,)))

    def _user_roots(self) -> tuple[list[Path], Path | None]:
        """The user cache's roots lookups read (the root builds go to, the configured one, existing fallbacks) and
        the one among them builds write to (None: not known yet without creating it); creates nothing."""
        user_roots: list[Path] = []
        if self._root is not None:
            user_roots.append(self._root)
        if self._requested is not None and self._requested not in user_roots:
            user_roots.append(self._requested)
        writable = self._root
        if writable is None and self._requested is not None:
            if self._requested_writable():
                writable = self._requested
            else:  # builds will go to a fallback root: the one an earlier process used serves too
                fbs = [c for c in self._fallback_roots() if c not in user_roots and c.is_dir()]
                user_roots += fbs
                writable = next((c for c in fbs if _writable_dir(c)), None)
        return user_roots, writable

    def memo_roots(self) -> tuple[list[Path], Path | None]:
        """(existing user-cache roots, the existing one that may be written or None) for per-machine memos such as
        nvcc-versions.json; creates nothing, logs nothing."""
        roots, writable = self._user_roots()
        roots = [r for r in roots if os.path.isdir(r)]
        return roots, (writable if writable in roots and _writable_dir(writable) else None)

    def planned_root(self) -> Path | None:
        """The root builds would go to, without creating it or logging the fallback line (`cache path`, `ls`);
        None when no candidate could be written."""
        if self._root is not None:
            return self._root
        if self._requested is not None and not self._requested_readonly:
            if os.path.isdir(self._requested):
                _check_owner_and_mode(self._requested, os.stat(self._requested), "directory")  # as `root` would
            if self._creatable(self._requested):
                return self._requested
        return next((c for c in self._fallback_roots() if self._creatable(c)), None)

    @staticmethod
    def _creatable(path: Path) -> bool:
        """A writable directory, or one whose nearest existing ancestor is writable (so _prepare_root can make it)."""
        p = path
        while not os.path.lexists(p):
            if p.parent == p:
                return False
            p = p.parent
        return _writable_dir(p)

    def _prebuilt_dirs(self) -> tuple[Path, ...]:
        if self._prebuilt is None:  # the defaults, found once (the package lookup costs a sys.path scan)
            pkg = _kernels_package_dir()
            self._prebuilt = (_PREBUILT_DIR,) + ((pkg,) if pkg is not None else ())
        return self._prebuilt

    def search_roots(self) -> list[Path]:
        """The roots lookups read, in lookup order (read-only roots, prebuilt roots, the user cache); reads only,
        creates nothing. Callers keeping other records per root (analysis/) look them up here."""
        out: list[Path] = []
        for src in self._sources():
            if src.root not in out:
                out.append(src.root)
        return out

    def _requested_writable(self) -> bool:
        r = self._requested
        return r is not None and not self._requested_readonly and (not r.exists() or _writable_dir(r))

    def read_root_files(self, rel: str) -> Iterator[bytes]:
        """The bytes of <root>/<rel> in every root lookups read, in lookup order (analysis records), each checked as
        an entry's files are: a regular file (not a symlink), owned by a trusted user, not group/other-writable,
        and in a prebuilt root listed with its sha256 in prebuilt.json's "records". Others are skipped; reads only."""
        seen: set[Path] = set()
        for src in self._sources():
            if src.root in seen:
                continue
            seen.add(src.root)
            try:
                fd = os.open(src.root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    continue
                _check_owner_and_mode(src.root / rel, st, "file", trusted=src.trusted)
                with os.fdopen(os.dup(fd), "rb") as f:
                    data = f.read()
            except (OSError, CacheError):
                continue
            finally:
                os.close(fd)
            if src.records is not None and src.kind != "user" and \
                    src.records.get(rel) != hashlib.sha256(data).hexdigest():
                continue  # a prebuilt root vouches for the records it lists, and for nothing else
            yield data

    # ------------------------------------------------------------------------------------ main entry

    def get_or_build(
        self,
        key: str,
        name: str,
        build: Callable[[Path], Mapping[str, Any] | None],
        meta: Mapping[str, Any] | None = None,
        artifact: str = "kernel.so",
        *,
        key_for: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> Path:
        """Path of `artifact` inside the published entry for `key`, building it first if needed.

        `build(tmpdir)` writes sources, build.ninja and the artifact into `tmpdir` and returns extra meta
        (e.g. {"compiler": ..., "build_seconds": ...}) or None. If it raises, nothing is published and the
        exception propagates. `meta` (JSON-able; by convention {"fields": ..., "expressions": ...}) goes into
        meta.json. `name` is the readable name shown in logs and directory names. `key_for(pins)`: the key of
        the same signature built with a prebuilt root's recorded toolchain (see `lookup`).
        """
        hit = self._memo.get((key, artifact))
        if hit is not None:
            return hit
        return self._lookup_or_build(key, name, build, meta, artifact, key_for)

    def lookup(
        self,
        key: str | None,
        name: str,
        artifact: str = "kernel.so",
        *,
        key_for: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> Path | None:
        """Path of `artifact` in a published entry for the signature, or None; reads only, never builds.

        A root with prebuilt.json is searched under `key_for(its pins)` (None: the root serves nothing for this
        signature), every other source under `key`; `key=None` (this machine's toolchain is unknown, e.g. no nvcc)
        searches the prebuilt roots only."""
        if key is not None:
            hit = self._memo.get((key, artifact))
            if hit is not None:
                return hit
        self._check_request(key if key is not None else "0" * 64, artifact)
        for src in self._sources():
            k = self._key_in(src, key, key_for)
            if k is None:
                continue
            hit = self._memo.get((k, artifact))
            if hit is None:
                found = self._find_in(src, k, name, artifact)
                if found is None:
                    continue
                hit = self._remember(k, artifact, found / artifact,
                                     name if src.kind == "user" else f"{'prebuilt' if src.pins is not None else src.kind} {name}")
            if key is not None:
                self._memo[(key, artifact)] = hit
            return hit
        return None

    def _key_in(self, src: _Source, key: str | None, key_for) -> str | None:
        """The key `src` files this signature under: its pins' key for a prebuilt root, else `key`."""
        if src.pins is None or src.kind == "user" or key_for is None:
            return key
        why = src.pins.get("unreadable")
        if why is not None:
            if (str(src.root), why) not in self._warned:
                self._warned.add((str(src.root), why))
                warnings.warn(f"attngen: prebuilt root {src.root} is unusable: {why}; ignoring it. Fix: rebuild it "
                              f"(`python -m attngen prebuild`) or reinstall the package that installed it.",
                              CacheWarning, stacklevel=5)
            return None
        if key is not None and not self._same_cuda_major(src):
            return None
        return key_for(src.pins)

    @staticmethod
    def _same_cuda_major(src: _Source) -> bool:
        """False (logged once) when nvcc is present here and its major differs from the one `src` was built with:
        a library of another CUDA major may need another driver, so the kernel is built here (JIT) instead."""
        local = _local_pins() if _local_pins is not None else None
        mine, theirs = (local or {}).get("nvcc"), src.pins.get("nvcc") if src.pins is not None else None
        if not (isinstance(mine, (list, tuple)) and mine and isinstance(theirs, list) and theirs) or mine[0] == theirs[0]:
            return True
        _log_once(f"prebuilt root {src.root} was built with nvcc {'.'.join(map(str, theirs))}, this machine's nvcc is "
                  f"{'.'.join(map(str, mine))} (another CUDA major): skipping it, kernels are built with nvcc (JIT)")
        return False

    def _check_request(self, key, artifact) -> None:
        if not isinstance(key, str) or not _KEY_RE.match(key):
            raise CacheError(
                f"attngen cache: key {key!r} is not a lowercase hex digest (16-128 chars). "
                f"Fix: pass cache_key(fields)."
            )
        parts = Path(artifact).parts
        if not parts or Path(artifact).is_absolute() or ".." in parts or artifact in _RESERVED:
            raise CacheError(
                f"attngen cache: artifact {artifact!r} must be a relative path inside the entry, without '..', "
                f"and not {' or '.join(_RESERVED)}. Fix: pass e.g. artifact='kernel.so'."
            )

    def _lookup_or_build(self, key, name, build, meta, artifact, key_for=None) -> Path:
        self._check_request(key, artifact)
        k16 = key[:16]

        # Lookup: reads only, so a read-only cache serves without a single write.
        found = self.lookup(key, name, artifact, key_for=key_for)
        if found is not None:
            return found
        pinned = [str(src.root) for src in self._sources() if src.pins is not None and src.kind != "user"]
        if pinned:  # a deployment expecting prebuilt kernels should see the one that is missing
            log(f"no prebuilt kernel for {name} in {', '.join(pinned)}: building it with nvcc (JIT)")

        try:
            root = self.root
            entries = root / "entries"
            wanted = entries / f"{_slug(name)}-{k16}"
            with self._entry_lock(k16, name):
                # Re-check: another process may have published (or repaired) the entry while we waited.
                found = self._locate(wanted, entries, k16)
                if found is not None:
                    status, reason = self._check_entry(found, key, artifact)
                    if status == "ok":
                        return self._remember(key, artifact, found / artifact, name)
                    if status == "corrupt":
                        warnings.warn(
                            f"attngen: cache entry {found} ({name}) is corrupt: {reason}; removing it and "
                            f"rebuilding.",
                            CacheWarning,
                            stacklevel=3,
                        )
                        self._discard(found, k16)
                self._cleanup_tmp(held_k16=k16)
                entry = self._build_and_publish(wanted, key, k16, name, build, meta, artifact)
        except OSError as e:  # the cache's own file operations (the build function's errors pass through)
            if getattr(e, "_attngen_from_build", False):
                raise
            raise CacheError(
                f"attngen cache: cannot write {e.filename or self._root} ({e.strerror or e}) while building {name}. "
                f"Fix: make it writable, or set ATTNGEN_CACHE_DIR to a writable directory you own."
            ) from e
        return self._remember(key, artifact, entry / artifact, None)

    def _find_in(self, src: _Source, key: str, name: str, artifact: str) -> Path | None:
        """The valid entry for `key` in `src`, or None. Corrupt entries of read-only sources are skipped with a
        warning (once per entry); those of the writable root are left for the locked re-check to replace."""
        k16 = key[:16]
        for cand in self._candidates(src.entries, f"{_slug(name)}-{k16}", k16):
            try:
                status, reason = self._check_entry(cand, key, artifact, trusted=src.trusted)
            except CacheError as e:
                if src.kind == "user":
                    raise
                _skip_unsafe_root(src.root, e)
                continue
            if status == "ok":
                return cand
            if status == "corrupt" and src.kind != "user" and (str(cand), reason) not in self._warned:
                self._warned.add((str(cand), reason))
                fix = "reinstall the package that installed it" if src.kind == "prebuilt" else f"rebuild or remove {cand}"
                warnings.warn(
                    f"attngen: {src.kind} cache entry {cand} ({name}) is unusable: {reason}; ignoring it. Fix: {fix}.",
                    CacheWarning,
                    stacklevel=5,
                )
        return None

    def _remember(self, key: str, artifact: str, path: Path, hit_name: str | None) -> Path:
        if hit_name is not None:
            vlog(f"cache hit {hit_name}: {path}")
        self._memo[(key, artifact)] = path
        return path

    @staticmethod
    def _candidates(entries: Path, wanted_name: str, k16: str) -> list[Path]:
        """Entry directories for k16 under `entries`: the expected name first, then the same key published
        under another readable name."""
        wanted = entries / wanted_name
        out = [wanted] if os.path.lexists(wanted) else []
        out += [p for p in sorted(entries.glob(f"*-{k16}")) if p != wanted]
        return out

    @classmethod
    def _locate(cls, wanted: Path, entries: Path, k16: str) -> Path | None:
        found = cls._candidates(entries, wanted.name, k16)
        return found[0] if found else None

    # ------------------------------------------------------------------------------------ validation

    def _check_entry(
        self, entry: Path, key: str, artifact: str, *, trusted: frozenset[int] | None = None
    ) -> tuple[str, str | None]:
        """("ok"|"missing"|"corrupt", reason). Raises CacheError for entries another user could have written.

        Reads only. Every file must be a regular file listed in the manifest with its size and sha256 (no
        symlinks anywhere in the entry, no unlisted files); this runs once per key per process (afterwards the
        memo answers), so hashing a few MB of .so is paid once.
        """
        try:
            st = os.lstat(entry)
        except FileNotFoundError:
            return "missing", None
        if not stat.S_ISDIR(st.st_mode):
            return "corrupt", "it is not a directory" + (" (a symlink)" if stat.S_ISLNK(st.st_mode) else "")
        _check_owner_and_mode(entry, st, "entry", trusted=trusted)
        mpath = entry / MANIFEST_NAME
        try:
            mst = os.lstat(mpath)
        except FileNotFoundError:
            return "corrupt", f"{MANIFEST_NAME} is missing (the build was interrupted or files were removed)"
        if not stat.S_ISREG(mst.st_mode):
            return "corrupt", f"{MANIFEST_NAME} is not a regular file"
        _check_owner_and_mode(mpath, mst, "file", trusted=trusted)
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
            files = manifest["files"]
            mkey = manifest["key"]
        except PermissionError as e:
            return "corrupt", f"{MANIFEST_NAME} cannot be read ({e.strerror}; `chmod -R a+rX` the cache to share it)"
        except (OSError, ValueError, KeyError, TypeError) as e:
            return "corrupt", f"{MANIFEST_NAME} is unreadable ({type(e).__name__}: {e})"
        if mkey != key:
            return "corrupt", f"{MANIFEST_NAME} belongs to key {str(mkey)[:16]}..., not {key[:16]}..."
        if not isinstance(files, dict) or artifact not in files:
            return "corrupt", f"the manifest does not list the artifact {artifact!r}"
        for rel in files:
            relp = Path(rel)
            if relp.is_absolute() or ".." in relp.parts or rel == MANIFEST_NAME:
                return "corrupt", f"the manifest lists the invalid path {rel!r}"
        # Everything in the entry, symlinks included (os.walk does not follow them): only listed regular files.
        seen: dict[str, os.stat_result] = {}
        for dirpath, dirnames, filenames in os.walk(entry):
            dpath = Path(dirpath)
            for d in dirnames:
                dst = os.lstat(dpath / d)
                if stat.S_ISLNK(dst.st_mode):
                    return "corrupt", f"{(dpath / d).relative_to(entry)} is a symlink (entries hold regular files only)"
                _check_owner_and_mode(dpath / d, dst, "directory", trusted=trusted)
            for f in filenames:
                fp = dpath / f
                rel = fp.relative_to(entry).as_posix()
                fst = os.lstat(fp)
                if stat.S_ISLNK(fst.st_mode):
                    return "corrupt", f"{rel} is a symlink (entries hold regular files only)"
                if not stat.S_ISREG(fst.st_mode):
                    return "corrupt", f"{rel} is not a regular file"
                if rel != MANIFEST_NAME:
                    seen[rel] = fst
        for rel in sorted(set(seen) - set(files)):
            return "corrupt", f"{rel} is not listed in the manifest"
        for rel, rec in files.items():
            fst = seen.get(rel)
            if fst is None:
                return "corrupt", f"{rel} is missing"
            fpath = entry / rel
            _check_owner_and_mode(fpath, fst, "file", trusted=trusted)
            try:
                size, digest = int(rec["size"]), str(rec["sha256"])
            except (KeyError, TypeError, ValueError):
                return "corrupt", f"the manifest record of {rel} is malformed"
            if fst.st_size != size:
                return "corrupt", f"{rel} has {fst.st_size} bytes, the manifest says {size}"
            try:
                ok = _sha256_file(fpath) == digest
            except PermissionError as e:
                return "corrupt", f"{rel} cannot be read ({e.strerror}; `chmod -R a+rX` the cache to share it)"
            if not ok:
                return "corrupt", f"{rel} does not match its sha256 in the manifest"
        return "ok", None

    # --------------------------------------------------------------------------------------- locking

    def _lock_path(self, k16: str) -> Path:
        return self.root / "locks" / f"{k16}.lock"

    @contextlib.contextmanager
    def _entry_lock(self, k16: str, name: str) -> Iterator[None]:
        """Exclusive flock on locks/<k16>.lock; also serializes threads (each open() is its own lock)."""
        if fcntl is None:
            yield
            return
        fd = os.open(self._lock_path(k16), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                vlog(f"waiting for another process building {name} (lock {self._lock_path(k16)})")
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError as e:  # e.g. ENOLCK on some network filesystems
                if not self._warned_no_flock:
                    self._warned_no_flock = True
                    warnings.warn(
                        f"attngen: cannot lock files under {self.root} ({e}); concurrent processes may build "
                        f"the same kernel twice (results stay correct: publishing is atomic). Fix: set "
                        f"ATTNGEN_CACHE_DIR to a local filesystem.",
                        CacheWarning,
                        stacklevel=5,
                    )
            yield
        finally:
            os.close(fd)  # releases the lock

    def _try_lock(self, k16: str) -> int | None:
        """fd holding k16's lock, or None if someone else holds it (or locking is unavailable)."""
        if fcntl is None:
            return None
        try:
            fd = os.open(self._lock_path(k16), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            os.close(fd)
            return None

    def _cleanup_tmp(self, held_k16: str | None = None) -> int:
        """Remove tmp dirs left by killed builds: those whose entry lock nobody holds. Returns the count."""
        tmp = self.root / "tmp"
        removed = 0
        try:
            names = os.listdir(tmp)
        except OSError:
            return 0
        for nm in names:
            p = tmp / nm
            k16 = nm[:16]
            if k16 == held_k16:
                _rmtree(p)  # we hold this key's lock, so no live build owns it
                removed += 1
                continue
            if _K16_RE.match(k16) and fcntl is not None:
                fd = self._try_lock(k16)
                if fd is None:
                    continue  # a build of that key is running
                try:
                    _rmtree(p)
                    removed += 1
                finally:
                    os.close(fd)
                continue
            with contextlib.suppress(OSError):
                if time.time() - os.lstat(p).st_mtime > _STALE_SECONDS_WITHOUT_LOCKS:
                    _rmtree(p)
                    removed += 1
        if removed:
            vlog(f"removed {removed} stale temporary build dir(s) under {tmp}")
        return removed

    def _discard(self, entry: Path, k16: str) -> None:
        """Move an entry out of entries/ atomically, then delete it (readers never see it half-deleted)."""
        trash = self.root / "tmp" / f"{k16}.trash.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            os.rename(entry, trash)
        except FileNotFoundError:
            return
        _rmtree(trash)

    # ----------------------------------------------------------------------------------------- build

    def _build_and_publish(self, wanted, key, k16, name, build, meta, artifact) -> Path:
        tmpdir = Path(tempfile.mkdtemp(prefix=f"{k16}.{os.getpid()}.", dir=self.root / "tmp"))
        loud = verbose()
        if loud:
            log(f"building {name} in {tmpdir}")
        else:
            sys.stderr.write(f"attngen: building {name} ... ")
            sys.stderr.flush()
        t0 = time.perf_counter()
        try:
            try:
                extra = build(tmpdir)
            except OSError as e:
                e._attngen_from_build = True  # type: ignore[attr-defined]  # not the cache's: passes through as is
                raise
            seconds = time.perf_counter() - t0
            if extra is None:
                extra = {}
            if not isinstance(extra, Mapping):
                raise BuildError(
                    f"attngen cache: the build function for {name} returned {type(extra).__name__}; expected a "
                    f"dict of extra meta or None. Fix: return e.g. {{'compiler': 'nvcc 13.0'}}."
                )
            self._seal(tmpdir, key, name, artifact, seconds, meta or {}, extra)
            entry = self._publish(tmpdir, wanted, key, k16, artifact)
        except BaseException:
            if loud:
                log(f"build of {name} failed after {time.perf_counter() - t0:.1f} s")
            else:
                sys.stderr.write("failed\n")
                sys.stderr.flush()
            _rmtree(tmpdir)
            raise
        if loud:
            log(f"built {name} in {seconds:.1f} s: {entry / artifact}")
        else:
            sys.stderr.write(f"{seconds:.1f} s\n")
            sys.stderr.flush()
        return entry

    def _seal(self, tmpdir: Path, key, name, artifact, seconds, meta, extra) -> None:
        """Check the build output, drop group/other write bits, write meta.json, then manifest.json LAST."""
        art = tmpdir / artifact
        if not art.is_file() or art.is_symlink():
            raise BuildError(
                f"attngen cache: the build of {name} finished without producing {artifact!r} in {tmpdir} "
                f"(found: {sorted(os.listdir(tmpdir))}). Fix: the build function must write the artifact "
                f"into the directory it is given."
            )
        if (tmpdir / MANIFEST_NAME).exists():
            raise BuildError(
                f"attngen cache: the build of {name} wrote {MANIFEST_NAME}, a name the cache reserves. "
                f"Fix: name that file differently."
            )
        now = time.time()
        doc: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "name": name,
            "key": key,
            "artifact": artifact,
            "created": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="seconds"),
            "created_unix": now,
            "build_seconds": round(seconds, 3),
            "host": socket.gethostname(),
            "python": sys.version.split()[0],
        }
        base = dict(doc)
        doc.update(meta)
        doc.update(extra)  # the build may refine e.g. build_seconds, but not the identity fields
        doc.update({k: base[k] for k in _META_PROTECTED})
        (tmpdir / META_NAME).write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        write_manifest(tmpdir, key, artifact, name)

    def _publish(self, tmpdir: Path, wanted: Path, key: str, k16: str, artifact: str) -> Path:
        """os.rename the sealed tmp dir to its entry name; resolve a racing or broken occupant."""
        for _ in range(3):
            try:
                os.rename(tmpdir, wanted)
                return wanted
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
                    raise
            # Only reachable without working locks (or after manual copying): someone else published first.
            if self._check_entry(wanted, key, artifact)[0] == "ok":
                _rmtree(tmpdir)
                return wanted
            self._discard(wanted, k16)
        raise CacheError(f"attngen cache: could not publish {wanted}: it keeps reappearing. Fix: clear the cache.")

    # ------------------------------------------------------------------------------------ management

    @staticmethod
    def _entry_dirs(entries: Path) -> list[Path]:
        try:
            return sorted(p for p in entries.iterdir() if p.is_dir() and not p.is_symlink())
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any] | None:
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            return doc if isinstance(doc, dict) else None
        except (OSError, ValueError):
            return None

    def _describe(self, d: Path, source: str = "user") -> tuple[CacheEntry, dict[str, Any]]:
        meta = self._read_json(d / META_NAME) or {}
        manifest = self._read_json(d / MANIFEST_NAME) or {}
        size = 0
        for dirpath, _, filenames in os.walk(d):
            for f in filenames:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(dirpath, f)).st_size
        try:
            created = float(meta.get("created_unix") or os.lstat(d).st_mtime)
        except (OSError, TypeError, ValueError):
            created = 0.0
        entry = CacheEntry(
            name=str(meta.get("name") or d.name),
            key=str(meta.get("key") or manifest.get("key") or ""),
            size=size,
            created=created,
            path=d,
            artifact=meta.get("artifact") or manifest.get("artifact"),
            source=source,
        )
        return entry, meta

    def _all_entry_dirs(self, *, prebuilt: bool) -> list[tuple[Path, str]]:
        """(entry dir, source kind) over every source, reads only; `prebuilt=False` leaves out the package's."""
        return [(d, src.kind) for src in self._sources() if prebuilt or src.kind != "prebuilt"
                for d in self._entry_dirs(src.entries) if (d / MANIFEST_NAME).exists() or src.kind == "user"]

    def list_entries(self) -> list[CacheEntry]:
        """Published entries of the user cache and of the read-only roots (not prebuilt ones), oldest first;
        `CacheEntry.source` says which. Reads only."""
        return sorted((self._describe(d, kind)[0] for d, kind in self._all_entry_dirs(prebuilt=False)),
                      key=lambda e: (e.created, e.path.name))

    def readonly_roots(self) -> list[Path]:
        """The entry directories looked up but never written (read-only roots, prebuilt, a read-only user cache)."""
        return [src.entries for src in self._sources() if src.kind != "user"]

    def info(self, key_or_prefix: str) -> dict[str, Any]:
        """meta.json of the entry whose key starts with `key_or_prefix` (or whose directory name does),
        plus "path", "source", "size_bytes" and "files" (the manifest). Searches every source."""
        q = key_or_prefix.strip()
        if not q:
            raise CacheError("attngen cache info: empty key. Fix: pass a key or key prefix from `attngen cache ls`.")
        matches = []
        for d, kind in self._all_entry_dirs(prebuilt=True):
            entry, meta = self._describe(d, kind)
            if (entry.key and entry.key.startswith(q.lower())) or d.name == q or d.name.startswith(q):
                matches.append((entry, meta))
        if not matches:
            where = ", ".join(str(src.entries) for src in self._sources()) or str(self._requested)
            raise CacheError(
                f"attngen cache info: no entry matches {q!r} in {where}. "
                f"Fix: pick a key from `python -m attngen cache ls`."
            )
        if len(matches) > 1:
            shown = ", ".join(f"{e.key[:16]} ({e.name})" for e, _ in matches[:10])
            raise CacheError(
                f"attngen cache info: {q!r} matches {len(matches)} entries: {shown}. Fix: give more of the key."
            )
        entry, meta = matches[0]
        out = dict(meta)
        out["path"] = str(entry.path)
        out["source"] = entry.source
        out["size_bytes"] = entry.size
        out["files"] = (self._read_json(entry.path / MANIFEST_NAME) or {}).get("files", {})
        return out

    def clear(self) -> int:
        """Remove every published entry of the writable root (and stale temp dirs); returns the number of entries
        removed. Read-only roots are never touched.

        Libraries already loaded by running processes stay valid (Linux keeps unlinked files mapped).
        """
        n = 0
        for d in self._entry_dirs(self.root / "entries"):
            k16 = d.name.rsplit("-", 1)[-1][:16]
            self._discard(d, k16 if _K16_RE.match(k16) else "0" * 16)
            n += 1
        self._cleanup_tmp()
        self._memo.clear()
        return n

    def forget(self) -> None:
        """Drop the in-process memo (next lookups re-validate entries on disk)."""
        self._memo.clear()


# ------------------------------------------------------------------------------------ module-level API

_defaults: dict[tuple[str | None, ...], ArtifactCache] = {}


_pinned_default: list[ArtifactCache] = []


def set_default_cache(cache: ArtifactCache | None) -> None:
    """Make `cache` this process's `default_cache()` whatever the environment (None: back to the environment's);
    prebuild's workers use a cache with only their output root."""
    _pinned_default[:] = [cache] if cache is not None else []


def default_cache() -> ArtifactCache:
    """The process-wide cache for the current ATTNGEN_CACHE_DIR / XDG_CACHE_HOME / ATTNGEN_CACHE_READONLY (one
    instance per combination), unless `set_default_cache` pinned one."""
    if _pinned_default:
        return _pinned_default[0]
    env = os.environ
    k = (env.get("ATTNGEN_CACHE_DIR"), env.get("XDG_CACHE_HOME"), env.get(READONLY_ENV))
    c = _defaults.get(k)
    if c is None:
        c = _defaults.setdefault(k, ArtifactCache())
    return c


def cache_root() -> Path:
    """Root directory of the default cache (created if needed)."""
    return default_cache().root


def get_or_build(key, name, build, meta=None, artifact="kernel.so") -> Path:
    """`default_cache().get_or_build(...)`."""
    return default_cache().get_or_build(key, name, build, meta, artifact)


def list_entries() -> list[CacheEntry]:
    return default_cache().list_entries()


def clear() -> int:
    return default_cache().clear()


def info(key_or_prefix: str) -> dict[str, Any]:
    return default_cache().info(key_or_prefix)
