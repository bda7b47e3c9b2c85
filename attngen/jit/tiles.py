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
    return _first_fitting(SM80_TILES, head_dim, arch, "tile configuration")


def _first_fitting(table: dict, head_dim: int, arch: str, what: str):
    """The first of table[head_dim] whose smem_bytes fit the arch's shared memory per block."""
    num, _ = parse_arch(arch)
    if head_dim not in table:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {SUPPORTED_HEAD_DIMS}")
    limit = SMEM_PER_BLOCK.get(num, SMEM_DEFAULT)
    for cfg in table[head_dim]:
        if cfg.smem_bytes(head_dim) <= limit:
            return cfg
    raise BuildError(f"no {what} for head dim {head_dim} fits the {limit} bytes of shared memory of {arch}")


# ------------------------------------------------------------------------------------------ decode


@dataclass(frozen=True)
class DecodeTileConfig:
    """Tiles of the decode kernel (fwd_decode.cuh): 16 packed query rows (block_q: query heads of one kv head
    times query positions) per CTA, K/V tiles of ``block_k`` cache positions split over ``num_warps`` warps, in a
    ring of ``stages`` (a memory-bound kernel: the ring keeps stages - 1 tiles in flight; two CTAs per SM where
    the ring allows)."""

    block_k: int
    stages: int
    num_warps: int = 4
    min_blocks: int = 1
    block_q: int = 16
    # the kernel and its combine launched as programmatic dependents (pdl.cuh): each scheduled while the kernel
    # ahead of it drains, the combine's launch under the kernel's tail (on sm_90; below it they launch plainly).
    # On: B = 1 decode 137.7 -> 137.1 us per graph replay, B = 8 / 64 level (docs/performance.md, "Decode")
    pdl: bool = True

    def smem_bytes(self, head_dim: int) -> int:
        """The packed Q rows (padded by 16 bytes), then the K/V ring (unpadded, swizzled rows)."""
        return self.block_q * (head_dim + 8) * 2 + 2 * self.stages * self.block_k * head_dim * 2


DECODE_TILES = {
    64: (DecodeTileConfig(block_k=64, stages=4),),
    128: (DecodeTileConfig(block_k=64, stages=3), DecodeTileConfig(block_k=64, stages=2)),
    256: (DecodeTileConfig(block_k=32, stages=3, num_warps=2), DecodeTileConfig(block_k=32, stages=2, num_warps=2)),
}


def decode_tile_config(head_dim: int, arch: str = "sm_80") -> DecodeTileConfig:
    """The decode kernel's tiles for a head dim on an arch: the first preference that fits its shared memory."""
    return _first_fitting(DECODE_TILES, head_dim, arch, "decode tile configuration")


# ----------------------------------------------------------------------------------- sm80 backward


@dataclass(frozen=True)
class BwdTileConfig:
    """Tiles of the portable backward kernel (bwd_sm80.cuh): a CTA holds BK kv rows and walks q blocks of BQ
    rows; ``warps_d`` warps share one 16-row kv slice, each accumulating D / warps_d columns of dK and dV (the
    registers of a slice's dK and dV at head dim 256 do not fit one warp)."""

    block_q: int
    block_k: int
    num_warps: int = 4
    warps_d: int = 1
    min_blocks: int = 1

    def smem_bytes(self, head_dim: int) -> int:
        """K, V resident; Q, dO double-buffered; dS^T; the row statistics (lse, delta) per stage."""
        pitch = (head_dim + 8) * 2
        return (2 * self.block_k + 4 * self.block_q) * pitch + self.block_k * (self.block_q + 8) * 2 \
            + 2 * 2 * self.block_q * 4


# Preference order per head dim; the first that fits the arch's shared memory per block is used. Each warp
# holds 16 kv rows: dK + dV take D / warps_d registers per thread, S^T and dP^T BQ / 2 each.
SM80_BWD_TILES = {
    64: (BwdTileConfig(block_q=64, block_k=128, num_warps=8),),
    128: (BwdTileConfig(block_q=32, block_k=64, num_warps=4),),  # BQ 64: 255 registers, spills
    256: (BwdTileConfig(block_q=32, block_k=64, num_warps=8, warps_d=2),
          BwdTileConfig(block_q=16, block_k=32, num_warps=4, warps_d=2)),
}


def bwd_tile_config(head_dim: int, arch: str = "sm_80") -> BwdTileConfig:
    """The backward kernel's tiles for a head dim on an arch: the first preference that fits its shared memory."""
    return _first_fitting(SM80_BWD_TILES, head_dim, arch, "backward tile configuration")


# ----------------------------------------------------------------------------------- sm90 backward


@dataclass(frozen=True)
class Sm90BwdTiles:
    """Tiles of the sm90 backward kernel (bwd_sm90.cuh): a CTA holds BK = 128 kv rows (two consumer warpgroups
    of 64) and walks q blocks of BQ rows, Q / dO in a ``stages``-deep ring (sm90_bwd_layout.cuh)."""

    # q rows per step: 64, or 80 at head dim 128 (FA3's choice without a causal mask: dQ computed transposed, dS^T in
    # 32-byte swizzle rows; not with dkv_staged, whose dK takes the dS^T buffers as 128-byte rows). On no rung: full
    # attention's step measured no faster at 80 (docs/performance.md)
    block_q: int = 64
    block_k: int = 128
    stages: int = 2
    producer_regs: int = 24   # setmaxnreg budgets: 128 * producer + 256 * consumer <= 384 * 168
    consumer_regs: int = 240
    # kv-block j starts its walk (walk_shift * j) % n q-blocks into its range of n and wraps around, so that the
    # kv blocks sharing one range (a document's) do not add into the same dQ tiles in step (0: no rotation)
    walk_shift: int = 0
    # one CTA per SM taking kv blocks from a counter in launch order, the next block's K and V loading under this
    # one's dK / dV stores (False: a CTA per kv block; deterministic mode always launches that way)
    persistent: bool = True
    # work tiles in sections of (batch, kv head) pairs of about one wave, kv block slowest within a section, as the
    # forward orders its q blocks (False: kv block fastest, one pair after another, so the grid ends on the last
    # head's walks, the longest of them under causal-like masks among its last tiles)
    sections: bool = True
    # each section's work tiles sorted by the length of their walks, longest first, by the preprocess at run time
    # (bwd_sm90.cuh tile order), so that the grid ends on short walks under any mask (deterministic mode: off)
    order: bool = True
    # how the fp32 dQ accumulator starts out (bwd_sm90.cuh; deterministic mode always takes 0): 0 zeroed by the
    # preprocess; 1 not zeroed, the first addition into each chunk a store (the preprocess zeroes a flag per chunk)
    dq_init: int = 1
    # a relative score mod (score_mod(s) = a(d) s + b(d), d = q_idx - kv_idx; b not linear in d) evaluated once per
    # diagonal of a thread's elements, its diagonal gradient sites summed in registers first (bwd_probs.cuh's
    # probs_t_rel; False: score_mod per element)
    rel_walk: bool = True
    # with rel_walk: each consumer warp evaluates the relative score mod once per diagonal of its 16 kv rows and the
    # q-block (BQ + 15 slots of 4 to 16 bytes in shared memory) and every thread reads its diagonals' slots, where that
    # fits beside the gradient bins (False, or where it does not fit: each thread evaluates its own 2 (BQ / 8 + 1))
    rel_stage: bool = True
    # the preprocess, the main kernel and the postprocess launched as programmatic dependents (pdl.cuh): each
    # scheduled while the kernel ahead of it drains, its launch and prologue under that kernel's tail
    pdl: bool = False
    # without a score_mod: P^T from S^T while dP^T = V dO^T is still in flight, dV's product issued before the wait
    # for dP^T, dS^T under it (FA3's order; False: one pass over S^T and dP^T once both products are done)
    split_probs: bool = False
    # a work tile's dK and dV staged in shared memory (dK in the consumer's rows of the two dS^T buffers, dV in its
    # staged-dQ buffer at head dim 128, in the second dS^T buffer at 64) and stored with TMA by one thread per
    # consumer, the next tile's first dS^T and dQ writes waiting for the stores to have read them (False: every
    # thread stores its rows from registers; on in the first rung of a mask other than a half plane without a
    # score_mod, sm90_bwd_ladder)
    dkv_staged: bool = False
    # the next q-block's S^T = K Q^T issued by this step, so that the tensor cores have it while the step ends: 1 once
    # dQ's product is done, under dQ's staging and the walk's step; 2 once dV's and dK's are, under dQ's product too
    # (0: each step issues its own). 2 on the staged rung and on full attention's 80-row rung at head dim 128
    # (sm90_bwd_ladder); causal's split rung measured within the runs' spread of each step issuing its own
    # (docs/performance.md)
    s_ahead: int = 0
    # a suspend-time hint (ns) for the waits off the products' path: the tile loader's for the walk's end, the producer's
    # for ring slots, the dQ writers' for staged dQ (whose end then comes through the same barrier too, after dq_done).
    # Without it a thread polls once per the hardware's default time limit, a whole walk long for the loader, each
    # poll an issued instruction beside the consumers' (0: no hint; 2000 in SM90_BWD_TILES, so on every rung but the
    # split rung sm90_bwd_ladder tries again without it: docs/performance.md)
    wait_ns: int = 0
    # with split_probs: dS^T = P^T (dP^T - delta) from P^T as packed for dV's product (Elem, rounded as the eager
    # implementation rounds its probabilities), so that the fp32 P^T is not live beside dP^T, dK, dV and the packed
    # fragments: what keeps block_q 80 inside the consumers' registers (128 bytes spilled without it; the first rung
    # of full attention at head dim 128, sm90_bwd_ladder)
    ds_from_packed: bool = False
    # a warp's dS^T fragments of a q step stored to shared memory with one stmatrix (four 8 x 8 matrices) instead of
    # four 32-bit stores per thread (bwd_sm90.cuh store_ds: the same bytes at the same places; FA4's sm90 backward
    # stores dS so). On no rung (docs/performance.md, sessions 40 and 43: with stats_early, wip/ds-rungs.patch)
    ds_stmatrix: bool = False
    # with split_probs, bf16 inputs: dS^T = P^T (dP^T - delta) multiplied as bf16 pairs (mul.rn.bf16x2) from P^T as
    # packed for dV's product and dP^T - delta rounded to bf16 once (the eager implementation rounds dP^T itself
    # before subtracting), straight into dK's packed fragments: two instructions per pair where unpacking, two
    # products and packing took five (bwd_sm90.cuh grad_scores_mul_packed_t; fp16 keeps the fp32 products, whose
    # range it needs). On no rung (docs/performance.md, sessions 40 and 43: with stats_early, wip/ds-rungs.patch)
    ds_mul_packed: bool = False
    # with split_probs, which row statistics a step reads from shared memory into registers ahead of the products they
    # are used under (bwd_sm90.cuh STATS_EARLY), as FA4's sm90 backward reads them, rather than where the exponentials
    # and dS^T use them, each load then waiting on shared memory that the products' operand reads keep busy: 1 delta
    # before dV's product is issued, 2 lse before dP^T's (and S^T's), 3 both (0: none). On no rung: with ds_stmatrix
    # and ds_mul_packed it took 3-5% off full attention's step (docs/performance.md, session 43), and the ladder with
    # the three on every split rung (wip/ds-rungs.patch) waits for the GPU suite on its rungs
    stats_early: int = 0

    def __post_init__(self):
        if self.dq_init not in (0, 1):
            raise BuildError(f"Sm90BwdTiles.dq_init must be 0 (zeroed by the preprocess) or 1 (first stores), "
                             f"got {self.dq_init}")
        if self.block_q not in (64, 80) or (self.block_q == 80 and self.dkv_staged):
            raise BuildError(f"Sm90BwdTiles.block_q must be 64, or 80 without dkv_staged, got {self.block_q}"
                             f"{' with dkv_staged' if self.dkv_staged else ''}")
        if self.s_ahead not in (0, 1, 2):
            raise BuildError(f"Sm90BwdTiles.s_ahead must be 0 (off), 1 (the next S^T under dQ's staging) or 2 (under "
                             f"dQ's product), got {self.s_ahead}")
        if self.stats_early not in (0, 1, 2, 3):
            raise BuildError(f"Sm90BwdTiles.stats_early must be 0 (none), 1 (delta), 2 (lse) or 3 (both), got "
                             f"{self.stats_early}")
        if self.stats_early and not self.split_probs:
            raise BuildError("Sm90BwdTiles.stats_early reads the statistics ahead of the split pass's products: set "
                             "split_probs=True with it")
        if self.ds_mul_packed and not self.split_probs:
            raise BuildError("Sm90BwdTiles.ds_mul_packed multiplies P^T as packed for dV's product, which only the "
                             "split pass packs before dS^T: set split_probs=True with it")
        if not 0 <= self.wait_ns <= 10_000_000:
            raise BuildError(f"Sm90BwdTiles.wait_ns must be in [0, 10000000] (a suspend-time hint in ns; 0: none), "
                             f"got {self.wait_ns}")
        if not 0 <= self.walk_shift <= 1024:
            raise BuildError(f"Sm90BwdTiles.walk_shift must be in [0, 1024] (q-blocks per kv block of rotation), "
                             f"got {self.walk_shift}")

    def smem_bytes(self, head_dim: int) -> int:
        """K, V; the Q / dO ring; two dS^T buffers; the row statistics per stage; mbarriers; the consumers' staged
        dQ (BQ rows of a split of the head dim each, sm90_bwd_layout.cuh); alignment slack. Not counted: the consumers'
        slots (32 bytes), the work-tile slots (64), the staged dQ's alignment to 128 bytes and a variant's gradient bins
        (up to 26 KB with codegen.GRAD_DIAG_SITES = 3 diagonal sites), which the kernel's static_assert checks against
        the limit at build time."""
        kv = self.block_k * head_dim * 2
        q = self.block_q * head_dim * 2
        consumers = self.block_k // 64
        dq_n = head_dim // consumers if (head_dim // consumers) % 64 == 0 else head_dim
        return 1024 + 2 * kv + 2 * self.stages * q + 2 * self.block_k * self.block_q * 2 \
            + self.stages * 2 * self.block_q * 4 + 8 * (3 + 2 * self.stages + 3 * consumers) \
            + consumers * self.block_q * dq_n * 4


# Head dim 256 has no sm90 backward (dK + dV of 64 rows x 256 columns take the consumers' registers): the sm80
# backward serves it.
SM90_BWD_TILES = {64: Sm90BwdTiles(stages=2, wait_ns=2000), 128: Sm90BwdTiles(stages=2, wait_ns=2000)}


def sm90_bwd_ladder(head_dim: int, has_score_mod: bool = False, has_mask: bool = False,
                    half_plane: bool = False) -> tuple:
    """The settings an sm90 backward build tries, best first: the spec builds the first that ptxas compiles
    without spills, else the one that spills least. Without a score_mod a rung splits the probabilities
    (split_probs: P^T and dP^T's product overlapped), which keeps dP^T live through P^T's pass (prefix-LM at head dim
    128 spills there, and takes the next rung). Without a score_mod, a mask other than a half plane (a window,
    documents, a union) first tries that rung with dK and dV staged for TMA stores (dkv_staged): its walks are short or
    uneven, so a tile's end is a large share of its time (full and causal-like masks walk long ranges, and gained
    nothing; with a score_mod, the one pass staged did not clearly gain: docs/performance.md). At head dim 128 that
    rung first tries each step's S^T issued by the step before (s_ahead 2), which frees the registers that make the
    document's staged rung spill (prefix-LM gained by it, the window was level; at 64 it was level or slower); the
    staged rung without it is not tried after it (documents with int64 ids spill on both: it only lengthened their
    cold build). There the split rung is tried again without the waits' suspend-time hint (wait_ns 0) before the one
    pass: the hint's end arrival keeps a register live through the walks, which made documents with int64 ids spill on
    the split rung (16 bytes), and that rung without it is the kernel they were measured on (docs/performance.md,
    session 37). Full attention at head dim 128 first tries the split rung at 80 q rows per step with dS^T from the
    packed P^T (ds_from_packed, which keeps those tiles inside the registers) and each step's S^T issued by the step
    before: FA3's and FA4's tile without a causal mask, 2-3% off its step (docs/performance.md, session 38); masks
    keep 64 rows (causal-like walks start on the diagonal, and 80 rows spill there). Heavy masks
    spill in both roles (the producer's walk calls the tile classifier, the consumers evaluate mask_mod); the last
    rung moves registers to the producer (NATTEN-2D at head dim 128, a CTA per kv block: 2156 -> 1164 spilled bytes;
    a union of five parts: 80 -> 1008, so it keeps the first). scripts/bwd_ladder_spills.py prints the rung each
    training anchor builds clean at."""
    if head_dim not in SM90_BWD_TILES:
        raise BuildError(f"the sm90 backward has no tiles for head dim {head_dim}: expected one of "
                         f"{sorted(SM90_BWD_TILES)}; use kernel='sm80_bwd'")
    t = SM90_BWD_TILES[head_dim]
    producer_heavy = replace(t, producer_regs=56, consumer_regs=224)
    if has_score_mod:
        return t, producer_heavy
    split = replace(t, split_probs=True)
    if not has_mask and head_dim == 128:
        return (replace(split, block_q=80, ds_from_packed=True, s_ahead=2), split, t, producer_heavy)
    staged = (replace(split, dkv_staged=True),) if has_mask and not half_plane else ()
    unhinted = ()
    if staged and head_dim == 128:
        staged = (replace(staged[0], s_ahead=2),)
        unhinted = (replace(split, wait_ns=0),)
    return staged + (split,) + unhinted + (t, producer_heavy)


# ---------------------------------------------------------------------------------------------- sm90


@dataclass(frozen=True)
class Sm90Tiles:
    """Tiles and switches of the SM90 (TMA + wgmma) kernel. BQ is always 128: two consumer warpgroups x 64 rows."""

    block_k: int
    stages: int
    overlap: bool = True  # issue the next Q.K^T before this tile's softmax (intra-warpgroup overlap)
    pingpong: bool = True  # the two consumer warpgroups take turns issuing wgmmas
    # with overlap: the softmax of S(next) in a block of its own, so that ptxas keeps the wait for P V after it
    pin_softmax: bool = False
    persistent: bool = False  # grid = number of SMs; CTAs take work tiles from a global counter
    # > 0: the persistent grid only for kv lengths up to this (longer: one CTA per work tile)
    persistent_max_kv: int = 0
    # on the persistent grid with overlap: a tile's last P V and the next tile's first Q K^T issued together, the
    # epilogue under that Q K^T. On only in the first rung of causal-like masks without a score_mod at head dim 64
    # (there +1-3%; -2% at head dim 128, -8% on a dilated window); ptxas serializes the wgmmas of some variants
    # around it (alibi_doc: C7520, a rung the build then passes over) and takes many times longer on heavy score
    # mods (docs/performance.md)
    cross_tile: bool = False
    # the epilogue writes O into the work tile's Q buffer (its rows, which no Q K^T reads any more) and one thread per
    # consumer stores it with TMA, where O has Q's element type (not FP8) and cross_tile is off (False: every thread
    # stores its rows of O from registers; docs/performance.md)
    o_staged: bool = True
    # keep a row's running max while it grows by at most this (log2 units) and skip rescaling O (0: only while it
    # does not grow)
    rescale_threshold: float = 0.0
    # a relative score mod (score_mod(s) = a(d) s + b(d), d = q_idx - kv_idx; b not linear in d): each consumer warp
    # evaluates it once per diagonal of its 16 rows into shared memory (BK + 15 slots of 4 or 8 bytes) and every element
    # reads its diagonal's slot, where that fits beside the tiles (False, or where it does not fit: each thread
    # evaluates its own 2 (BK / 8 + 1) diagonals; score_mask.cuh)
    rel_stage: bool = True
    # launched as a programmatic dependent of the kernel ahead of it on the stream (pdl.cuh): scheduled while that
    # kernel drains, its launch and prologue under that kernel's tail
    pdl: bool = False
    block_q: int = 128
    elem_bytes: int = 2  # 1: FP8 (e4m3) inputs

    def smem_bytes(self, head_dim: int, staged_rel: int = 0) -> int:
        """Dynamic shared memory: 1 KiB alignment slack, the Q tile (two on the persistent grid where they
        fit: sm90_layout.cuh), the K/V ring, the consumer warps' relative terms (``staged_rel``: the bytes of a
        staged term, score_mask.cuh's REL_SLOT_BYTES, for a relative score mod with b not linear in d, else 0; with
        rel_stage, where they fit with one Q tile), mbarriers, the tile id."""
        q = self.block_q * head_dim * self.elem_bytes
        kv = self.block_k * head_dim * self.elem_bytes

        def size(q_bufs, rel):
            return 1024 + q_bufs * q + 2 * self.stages * kv + rel + 8 * (2 * q_bufs + 4 * self.stages + 2) + 8

        warp_rel = ((self.block_k + 15) * staged_rel + 15) // 16 * 16  # one consumer warp's slots (REL_WARP_BYTES)
        rel = 8 * warp_rel if self.rel_stage else 0
        rel = rel if size(1, rel) <= SM90_SMEM_LIMIT else 0
        return size(2, rel) if self.persistent and size(2, rel) <= SM90_SMEM_LIMIT else size(1, rel)


# Head dims whose half-plane masks without a score_mod try cross_tile first (docs/performance.md, "Tile choices":
# measured faster only on causal; level on a sliding window, slower on heavier masks).
CROSS_TILE_HEAD_DIMS = (64,)
SM90_SMEM_LIMIT = SMEM_PER_BLOCK[90]  # sm90_layout.cuh SMEM_LIMIT: 227 KiB opt-in per block
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


def sm90_ladder(head_dim: int, has_mask: bool, has_score_mod: bool, half_plane: bool = False) -> tuple:
    """The tile settings a variant's SM90 build tries, best first (the spec builds the first that ptxas
    compiles clean). Without a mask the ladder starts at the wide tiles; plain attention (no mask, no
    score_mod) and masked variants run every rung on the persistent grid; a half-plane mask (one linear
    inequality in q_idx and kv_idx: causal-like) without a score_mod first tries cross_tile at the head dims of
    CROSS_TILE_HEAD_DIMS."""
    if head_dim not in SM90_LADDER:
        raise BuildError(f"head dim {head_dim} is not supported: expected one of {sorted(SM90_LADDER)}")
    if has_mask:
        # Masked variants: the persistent grid (next tile's Q and K/V loaded under this one's end) at every kv
        # length; short work tiles gain most (docs/performance.md).
        ladder = tuple(replace(t, persistent=True) for t in SM90_LADDER[head_dim])
        if head_dim in CROSS_TILE_HEAD_DIMS and half_plane and not has_score_mod:
            ladder = (replace(ladder[0], cross_tile=True),) + ladder
        return ladder
    wide = SM90_WIDE.get(head_dim)
    ladder = ((wide,) if wide is not None else ()) + SM90_LADDER[head_dim]
    return ladder if has_score_mod else tuple(replace(t, persistent=True) for t in ladder)


# FP8 (e4m3) inputs, head dim 128: BK 192 (FlashAttention-3's FP8 width; V^T in three 64-byte swizzle columns,
# sm90_layout.cuh) with the softmax pinned ahead of the P V wait and no pingpong where ptxas fits it, else BK 128 (one
# 128-byte row); O rescaled whenever a row max grows (threshold 0), so that the row max's weight rounds exactly to
# e4m3 (a stale max rounded a peaked row's dominant weight by up to 2^-4); the persistent grid serves masked variants
# at every length (docs/performance.md, "FP8").
SM90_FP8_LADDER = (Sm90Tiles(192, 2, pingpong=False, pin_softmax=True, elem_bytes=1),
                   Sm90Tiles(128, 2, elem_bytes=1),
                   Sm90Tiles(128, 2, overlap=False, elem_bytes=1))


def sm90_fp8_ladder(has_mask: bool, has_score_mod: bool) -> tuple:
    """The FP8 forward's tile settings, best first: the persistent grid at every kv length, except for a score_mod
    without a mask (one CTA per work tile, as sm90_ladder has it)."""
    if has_score_mod and not has_mask:
        return SM90_FP8_LADDER
    return tuple(replace(t, persistent=True) for t in SM90_FP8_LADDER)
