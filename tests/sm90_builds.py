"""The sm90 build sets used by the CPU build checks (tests/test_build_sm90.py) and the sm90 GPU suite
(tests/gpu/test_kernel_sm90.py): many fixture libraries (tests/data/*.inc) in one ninja graph, each
(fixture, dtype, head dim, tiles or None for the default) in its own subdirectory."""
from __future__ import annotations

from typing import Optional

from attngen.jit import render, tiles
from helpers import add_library, fixture_inc

SM90_TILES = tiles.SM90_TILES
LADDER = tiles.SM90_LADDER


def render_sm90(variant_inc: str, dtype, head_dim: int, tiles: Optional[tiles.Sm90Tiles] = None) -> dict:
    """{filename: text} of one sm90 kernel library (kernel source, variant.inc, headers)."""
    return render.render_sources(variant_inc, dtype, head_dim, "sm_90a", tiles=tiles, kernel="sm90")


def sm90_key(name, dtype, hd, tiles) -> str:
    """Subdirectory name of one sm90 library in a build set (every tile option that changes the kernel)."""
    t = tiles or SM90_TILES[hd]
    return (f"{name}_{str(dtype).replace('torch.', '')}_{hd}_bk{t.block_k}s{t.stages}"
            f"{'' if t.overlap else '_noov'}{'' if t.pingpong else '_nopp'}{'_pin' if t.pin_softmax else ''}"
            f"{'_pers' if t.persistent else ''}{f'_max{t.persistent_max_kv}' if t.persistent_max_kv else ''}"
            f"{'_cross' if t.cross_tile else ''}{'' if t.o_staged else '_oreg'}"
            f"{f'_rt{t.rescale_threshold:g}' if t.rescale_threshold else ''}{'' if t.rel_stage else '_walk'}")


def sm90_sources(configs) -> dict:
    """One build.ninja for many libraries: each (fixture, dtype, head dim, tiles) in its own subdirectory,
    the shared headers at the top."""
    sources, kernels = {}, {}
    for name, dtype, hd, tiles in configs:
        src = render_sm90(fixture_inc(name), dtype, hd, tiles)
        sub = sm90_key(name, dtype, hd, tiles)
        # two different kernels under one key would leave only the last one built (and tested)
        kernel = kernels.setdefault(sub, src[render.KERNEL_SOURCE])
        assert kernel == src[render.KERNEL_SOURCE], f"{sub}: two different kernels under one key"
        add_library(sources, sub, src)
    return sources
