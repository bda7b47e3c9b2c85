"""Prebuilt kernel artifacts shipped inside the package (empty for now).

Each subdirectory is a cache entry with the same layout as ~/.cache/attngen/entries/<name>-<key[:16]>/
(artifact, sources, meta.json, manifest.json). attngen.cache looks here before the user's cache, validating
the manifest like any other entry. To ship one, copy a built entry directory here unchanged.
"""
