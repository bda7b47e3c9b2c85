"""On-disk per-signature artifact cache for compiled kernels (see docs/cache.md).

Typical use by the build layer:

    from attngen import cache
    key = cache.cache_key(fields)                       # fields: everything that changes the binary
    so = cache.default_cache().get_or_build(key, "causal bf16 hd128 sm_90a", build, meta={"fields": fields})
"""

from attngen.cache.keys import cache_key, canonical_json, hash_bytes
from attngen.cache.store import (
    META_NAME,
    MANIFEST_NAME,
    PREBUILT_MANIFEST,
    ArtifactCache,
    CacheEntry,
    CacheWarning,
    cache_root,
    clear,
    default_cache,
    default_cache_dir,
    get_or_build,
    info,
    list_entries,
    log,
    readonly_cache_dirs,
    verbose,
    vlog,
    write_if_different,
    write_manifest,
)
from attngen.errors import CacheError

__all__ = [
    "ArtifactCache",
    "CacheEntry",
    "CacheError",
    "CacheWarning",
    "MANIFEST_NAME",
    "META_NAME",
    "PREBUILT_MANIFEST",
    "cache_key",
    "cache_root",
    "canonical_json",
    "clear",
    "default_cache",
    "default_cache_dir",
    "get_or_build",
    "hash_bytes",
    "info",
    "list_entries",
    "log",
    "readonly_cache_dirs",
    "verbose",
    "vlog",
    "write_if_different",
    "write_manifest",
]
