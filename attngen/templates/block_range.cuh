// block_range.cuh: which kv tiles a q-block visits (EMPTY ones are skipped) and which are known FULL
// (no mask_mod), from the tile-level predicates of variant.inc (docs/kernel-interface.md); score_kv_tile
// (score_mask.cuh) treats the rest as PARTIAL. Shared by the kernels: every thread that walks the kv
// tiles (the sm80 kernel's, and the sm90 producer and consumers) computes the same sequence on its own.
// Include after variant.inc.
#pragma once

#include "attngen_common.cuh"

namespace attngen {

// The kv tiles of q-block i of a (BQ x BK)-tiled kernel: [j_begin, j_end) less the classifier-EMPTY
// ones are visited, [f_lo, f_hi) are known FULL.
struct KvRange {
  int j_begin, j_end, f_lo, f_hi;
};

template <int BQ, int BK>
ATTNGEN_DEV_INLINE KvRange kv_range(const CapturedArgs& C, const TileArgs& t, int i) {
  const int nkb = (t.KVLEN + BK - 1) / BK;
  KvRange r;
#if ATTNGEN_HAS_MASK
  r.j_begin = max(kv_block_lo<BQ, BK>(C, t, i), 0);
  r.j_end = min(kv_block_hi<BQ, BK>(C, t, i), nkb);
  r.f_lo = kv_full_lo<BQ, BK>(C, t, i);
  r.f_hi = kv_full_hi<BQ, BK>(C, t, i);
#else
  r.j_begin = 0;
  r.j_end = nkb;
  r.f_lo = 0;
  r.f_hi = nkb;
#endif
  return r;
}

// The first tile to visit at or after j (j_end when none): tiles proven EMPTY by the classifier are
// skipped; tiles in the FULL range [f_lo, f_hi) never are. (The range's fields come as plain ints.)
template <int BQ, int BK>
ATTNGEN_DEV_INLINE int next_kv_tile(const CapturedArgs& C, const TileArgs& t, int i, int j, int j_end, int f_lo,
                                    int f_hi) {
#if ATTNGEN_HAS_MASK && ATTNGEN_NEEDS_CLASSIFIER
  while (j < j_end && !(j >= f_lo && j < f_hi) && !tile_any<BQ, BK>(C, t, i, j)) ++j;
#endif
  return j;
}

}  // namespace attngen
