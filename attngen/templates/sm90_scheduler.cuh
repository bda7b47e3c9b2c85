// sm90_scheduler.cuh: work tiles of the sm90 kernel and who runs which. A work tile is one (q-block of
// BQ rows, query head, batch), numbered w = 0 .. num_tiles - 1 so that the q-block index falls slowest
// within a section: under causal-like masks (later q-blocks see more kv tiles) the longest tiles come
// first; with `ascending` (the first q-blocks are the longest: global query tokens) it rises instead, over
// all heads at once. Otherwise (batch, head) pairs are cut into sections of about kSectionTiles tiles
// (tile_sections.cuh) so that the CTAs running at once share the K/V of few heads in L2 (docs/performance.md).
// Who runs which tile:
//   - one CTA per tile: the hardware dispatches CTAs in blockIdx order, each to the SM that frees up.
//   - persistent, with a tile counter (sm90_tile_counter.cuh): CTA x starts with tile x, then its
//     producer takes the next untaken tile in this order (an atomic add) while it still loads the current
//     one: the same longest-first, first-free dispatch, and the next tile's loads overlap this tile's end.
//   - persistent without one (fallback): a static deal in rounds of gridDim.x tiles, snake order (odd
//     rounds reversed) so that a CTA handed a long tile in one round tends to get a short one in the next.
// The producer announces each tile of its CTA (-1: no more) in one shared-memory word: the n-th
// announcement completes phase n of "tile full", and phase n of "tile empty" once every consumer thread
// has read it, so both parities are n & 1.
#pragma once

#include "attngen_common.cuh"
#include "sm90_mbarrier.cuh"
#include "sm90_tile_counter.cuh"
#include "tile_sections.cuh"

namespace attngen {

template <int BQ>
ATTNGEN_DEV_INLINE int num_tiles(const AttngenFwdArgs& a) {
  return ((a.Lq + BQ - 1) / BQ) * a.Hq * a.B;
}

// Work tile of this CTA in round r of the static deal (rounds of gridDim.x tiles), or -1 past the end.
ATTNGEN_DEV_INLINE int static_deal_tile(int r, int ntiles) {
  const int base = r * (int)gridDim.x;
  const int w = base + ((r & 1) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x);
  return w < ntiles ? w : -1;
}

// Decode tile w into its q-block i and (batch, head). Called after setmaxnreg in each role: values
// computed before the role split and live across it get spilled by ptxas.
template <int BQ>
ATTNGEN_DEV_INLINE TileArgs tile_args(const AttngenFwdArgs& a, int w, int& i, bool ascending) {
  const int nqb = (a.Lq + BQ - 1) / BQ;
  const int heads = a.Hq * a.B;
  // ascending: one section, so that the first q-blocks of every head (the longest tiles) start in the first wave
  const SectionTile st = section_tile(w, nqb, heads, ascending ? heads : section_pairs(nqb, heads));
  i = ascending ? st.block : nqb - 1 - st.block;
  const int hb = st.pair;
  TileArgs t;
  t.QLEN = a.Lq;
  t.KVLEN = a.Lk;
  t.QOFF = a.q_offset;
  t.b = hb / a.Hq;
  t.h = hb - t.b * a.Hq;
  return t;
}

// The shared-memory word through which the producer announces the CTA's tiles, and its two mbarriers.
struct TileMailbox {
  uint32_t word, full, empty;  // shared-memory addresses

  ATTNGEN_DEV_INLINE int read() const {
    int w;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(w) : "r"(word) : "memory");
    return w;
  }
  // Producer: announce tile w (or the end, -1) once the consumers have all read the previous one.
  ATTNGEN_DEV_INLINE void announce(int w, uint32_t parity) const {
    mbar_wait(empty, parity ^ 1u);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(word), "r"(w) : "memory");
    mbar_arrive(full);
  }
  // Consumer thread: the announced tile. Every reader arrives itself (not one lane per warp after a
  // __syncwarp, which racecheck reported as a read/write race with the producer's next announcement).
  ATTNGEN_DEV_INLINE int receive(uint32_t parity) const {
    mbar_wait(full, parity);
    const int w = read();
    mbar_arrive(empty);
    return w;
  }
};

// The producer's next tile for this CTA after the one it just loaded (-1: none). Taken once this tile's
// loads are issued: the producer then waits for ring slots anyway, so the atomic's latency is hidden,
// and a value taken earlier would hold one of its 24 registers through the loop. The static deal reads
// the current tile back from the mailbox for the same reason.
template <bool PERSISTENT>
ATTNGEN_DEV_INLINE int next_work_tile(unsigned int* tile_counter, const TileMailbox& mailbox, int ntiles) {
  if (!PERSISTENT) return -1;
  if (tile_counter != nullptr) return take_tile(tile_counter, ntiles);
  const int w = mailbox.read();
  return static_deal_tile(w / (int)gridDim.x + 1, ntiles);
}

}  // namespace attngen
