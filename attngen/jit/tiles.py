"""Tile policy as data: which tile sizes each kernel family gets. Why these values: docs/performance.md
("Tile choices"); this module only states them."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..abi import SUPPORTED_HEAD_DIMS
from ..errors import BuildError
from .toolchain import parse_arch


# ---------------------------------------------------------------------------------------------- sm80


@dataclass(frozen=True)
class TileConfig:
    """Tiles of the portable (sm80, mma.sync) kernel."""

    block_q: int
    block_k: int
    num_warps: int = 4
    min_blocks: int = 1

    def smem_bytes(self, head_dim: int) -> int:
        """Q tile plus a double-buffered K/V pair, rows padded by 16 bytes."""
        pitch = (head_dim + 8) * 2
        return (self.block_q + 4 * self.block_k) * pitch


# Preference order per head dim; the first that fits the arch's shared memory per block is used.
SM80_TILES = {
    64: (TileConfig(block_q=128, block_k=64, num_warps=4),),
    128: (TileConfig(block_q=128, block_k=32, num_warps=4),),
    256: (TileConfig(block_q=128, block_k=64, num_warps=8), TileConfig(block_q=64, block_k=32, num_warps=4)),
}
# Opt-in shared memory per block (bytes) by compute capability number; unknown archs get the smallest.
SMEM_PER_BLOCK = {80: 166912, 87: 166912, 90: 232448, 100: 232448, 103: 232448}
SMEM_DEFAULT = 101376  # sm86, sm89, sm120, ...


def tile_config(head_dim: int, arch: str = "sm_80") -> TileConfig:
    """The sm80 kernel's tiles for a head dim on an arch: the first preference that fits its shared memory."""
    num, _ = parse_arch(arch)
    if head_dim not in SM80_TILES:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {SUPPORTED_HEAD_DIMS}")
    limit = SMEM_PER_BLOCK.get(num, SMEM_DEFAULT)
    for cfg in SM80_TILES[head_dim]:
        if cfg.smem_bytes(head_dim) <= limit:
            return cfg
    raise BuildError(f"no tile configuration for head dim {head_dim} fits the {limit} bytes of shared memory of {arch}")


# ---------------------------------------------------------------------------------------------- sm90


@dataclass(frozen=True)
class Sm90Tiles:
    """Tiles and switches of the SM90 (TMA + wgmma) kernel. BQ is always 128: two consumer warpgroups x 64 rows."""

    block_k: int
    stages: int
    overlap: bool = True  # issue the next Q.K^T before this tile's softmax (intra-warpgroup overlap)
    pingpong: bool = True  # the two consumer warpgroups take turns issuing wgmmas
    persistent: bool = False  # grid = number of SMs; CTAs take work tiles from a global counter
    # > 0: keep a row's running max while it grows by at most this (log2 units) and skip rescaling O
    rescale_threshold: float = 0.0
    block_q: int = 128

    def smem_bytes(self, head_dim: int) -> int:
        """Dynamic shared memory: 1 KiB alignment slack, the Q tile, the K/V ring, mbarriers, the tile id."""
        q = self.block_q * head_dim * 2
        kv = self.block_k * head_dim * 2
        return 1024 + q + 2 * self.stages * kv + 8 * (2 + 4 * self.stages + 2) + 8


_RT = 8.0
SM90_TILES = {64: Sm90Tiles(128, 3, rescale_threshold=_RT), 128: Sm90Tiles(128, 2, rescale_threshold=_RT),
              256: Sm90Tiles(80, 2, rescale_threshold=_RT)}
# Variants without a mask start from wider K/V tiles.
SM90_WIDE = {64: Sm90Tiles(176, 3, rescale_threshold=_RT), 128: Sm90Tiles(176, 2, rescale_threshold=_RT)}
# Lighter settings, best first, for mods that keep many values live (each measured spill-free on the
# heavier test fixtures; ptxas is not monotonic in BK, so the ladder is a list, not a rule).
SM90_LADDER = {
    64: (SM90_TILES[64], Sm90Tiles(96, 3, rescale_threshold=_RT), Sm90Tiles(64, 4, overlap=False, rescale_threshold=_RT)),
    128: (SM90_TILES[128], Sm90Tiles(112, 2, rescale_threshold=_RT), Sm90Tiles(96, 2, rescale_threshold=_RT),
          Sm90Tiles(64, 2, overlap=False, rescale_threshold=_RT)),
    256: (SM90_TILES[256], Sm90Tiles(64, 2, overlap=False, rescale_threshold=_RT)),
}


def sm90_ladder(head_dim: int, has_mask: bool, has_score_mod: bool) -> tuple:
    """The tile settings a variant's SM90 build tries, best first (the spec builds the first that ptxas
    compiles without spills). Without a mask the ladder starts at the wide tiles; plain attention (no
    mask, no score_mod) runs every rung on the persistent grid."""
    if head_dim not in SM90_LADDER:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {sorted(SM90_LADDER)}")
    if has_mask:
        return SM90_LADDER[head_dim]
    wide = SM90_WIDE.get(head_dim)
    ladder = ((wide,) if wide is not None else ()) + SM90_LADDER[head_dim]
    return ladder if has_score_mod else tuple(replace(t, persistent=True) for t in ladder)
