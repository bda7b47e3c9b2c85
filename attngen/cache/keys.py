"""Cache keys: a sha256 over a canonical JSON of everything that changes a compiled binary.

The build layer collects the fields (canonical variant text, captured-tensor dtypes/ranks, dtype, head dims,
feature flags, template hash, attngen/nvcc versions, arch, nvcc flags) and passes them to `cache_key`. Two field
dicts that differ only in key order or tuple-vs-list give one key; any changed value gives another.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import hashlib
import json
import os
from pathlib import Path, PurePath
from typing import Any, Iterable, Mapping

from attngen.errors import CacheError

__all__ = ["canonical_json", "cache_key", "hash_bytes", "hash_files", "hash_tree", "DEFAULT_TREE_EXCLUDE"]

# Bumped when the key derivation changes, so old entries become unreachable instead of being misread.
_KEY_DOMAIN = b"attngen-cache-key/1\0"
_FILES_DOMAIN = b"attngen-files/1\0"

DEFAULT_TREE_EXCLUDE = ("__pycache__", "*.pyc", "*.pyo", ".*", "*~")


def _canonical(obj: Any, where: str) -> Any:
    """Turn `obj` into plain JSON types, deterministically; reject anything whose text could vary per run."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj  # json writes repr(), which round-trips exactly
    if isinstance(obj, enum.Enum):
        return f"{type(obj).__qualname__}.{obj.name}"
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            if isinstance(k, str):
                sk = k
            elif k is None or isinstance(k, (bool, int, float)):
                sk = json.dumps(k)
            else:
                raise CacheError(
                    f"cache_key: dict key {k!r} at {where} has type {type(k).__name__}; "
                    f"expected str/int/float/bool/None. Fix: convert the key to str before passing the fields."
                )
            if sk in out:
                raise CacheError(
                    f"cache_key: keys at {where} collide after conversion to text ({k!r} -> {sk!r}). "
                    f"Fix: use distinct string keys."
                )
            out[sk] = _canonical(v, f"{where}[{sk!r}]")
        return out
    if isinstance(obj, (list, tuple)):
        return [_canonical(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        items = [_canonical(v, f"{where}{{...}}") for v in obj]
        return sorted(items, key=lambda x: json.dumps(x, sort_keys=True, separators=(",", ":")))
    if isinstance(obj, PurePath):
        return obj.as_posix()
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": bytes(obj).hex()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        d = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {"__type__": type(obj).__qualname__, **_canonical(d, where)}
    module = type(obj).__module__ or ""
    if module.startswith("torch") and type(obj).__name__ == "dtype":
        return str(obj)  # "torch.bfloat16"
    if module.startswith("sympy"):
        import sympy  # only reached when the caller passes sympy objects

        return {"__srepr__": sympy.srepr(obj)}
    if module.startswith("numpy") and hasattr(obj, "item"):
        return _canonical(obj.item(), where)
    raise CacheError(
        f"cache_key: value at {where} has type {type(obj).__module__}.{type(obj).__qualname__}, whose text is not "
        f"guaranteed to be stable between runs. Expected str/int/float/bool/None, list/tuple, dict, set, Path, "
        f"bytes, Enum, dataclass, torch.dtype or a sympy expression. Fix: pass a stable text form "
        f"(e.g. sympy.srepr(expr) or str(x))."
    )


def canonical_json(fields: Mapping[str, Any]) -> str:
    """The exact text `cache_key` hashes: sorted keys, no whitespace, ASCII only."""
    if not isinstance(fields, Mapping):
        raise CacheError(f"cache_key: expected a dict of fields, got {type(fields).__name__}. Fix: pass a dict.")
    return json.dumps(_canonical(fields, "fields"), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cache_key(fields: Mapping[str, Any]) -> str:
    """sha256 hex digest (64 chars) of `canonical_json(fields)`; independent of dict order."""
    return hashlib.sha256(_KEY_DOMAIN + canonical_json(fields).encode("ascii")).hexdigest()


def hash_bytes(data: bytes | str) -> str:
    """sha256 hex digest of bytes (str is encoded as UTF-8)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def hash_files(paths: Iterable[str | os.PathLike], *, root: str | os.PathLike | None = None) -> str:
    """sha256 over the names and contents of `paths`, independent of the order they are given in.

    Names are paths relative to `root` when given, else base names, so moving an installed package does not
    change the hash but renaming a template does.
    """
    items: list[tuple[str, Path]] = []
    for p in paths:
        p = Path(p)
        name = p.relative_to(root).as_posix() if root is not None else p.name
        items.append((name, p))
    items.sort(key=lambda t: t[0])
    for (a, pa), (b, pb) in zip(items, items[1:]):
        if a == b:
            raise ValueError(
                f"hash_files: {pa} and {pb} both hash under the name {a!r}. Fix: pass root= so names are "
                f"relative paths, or hash the directories separately."
            )
    h = hashlib.sha256(_FILES_DOMAIN)
    for name, p in items:
        data = p.read_bytes()
        h.update(name.encode("utf-8") + b"\0" + str(len(data)).encode("ascii") + b"\0")
        h.update(data)
    return h.hexdigest()


def _excluded(name: str, exclude: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pat) for pat in exclude)


def hash_tree(directory: str | os.PathLike, *, exclude: Iterable[str] = DEFAULT_TREE_EXCLUDE) -> str:
    """`hash_files` over every regular file below `directory` (recursively), named relative to it.

    A file or directory whose name matches a pattern in `exclude` is skipped (default: caches, dotfiles,
    editor backups). Symlinks to files are followed; symlinked directories are not descended into.
    This reads every file, so compute it once per process (e.g. at import of the build layer).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"hash_tree: {directory} is not a directory. Fix: pass the template directory that exists "
            f"(e.g. Path(attngen.__file__).parent / 'templates')."
        )
    exclude = tuple(exclude)
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if not _excluded(d, exclude))
        for f in filenames:
            if not _excluded(f, exclude) and os.path.isfile(os.path.join(dirpath, f)):
                files.append(Path(dirpath, f))
    return hash_files(files, root=directory)
