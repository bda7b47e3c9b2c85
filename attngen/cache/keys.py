"""Cache keys: a sha256 over a canonical JSON of everything that changes a compiled binary.

The build layer collects the fields (canonical variant text, captured-tensor dtypes/ranks, dtype, head dims,
feature flags, template hash, attngen/nvcc versions, arch, nvcc flags) and passes them to `cache_key`. Two field
dicts that differ only in key order or tuple-vs-list give one key; any changed value gives another.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from pathlib import PurePath
from typing import Any, Mapping

from attngen.errors import CacheError

__all__ = ["canonical_json", "cache_key", "hash_bytes"]

# Bumped when the key derivation changes, so old entries become unreachable instead of being misread.
_KEY_DOMAIN = b"attngen-cache-key/1\0"


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
