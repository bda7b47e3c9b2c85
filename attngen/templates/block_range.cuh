// block_range.cuh: which kv tiles a q-block visits (EMPTY ones are skipped) and which are known FULL
// (no mask_mod), from the tile-level predicates of variant.inc (docs/kernel-interface.md); score_kv_tile
// (score_mask.cuh) treats the rest as PARTIAL; a union mask also skips the tiles outside every one of its
// parts (block_parts.cuh). Shared by the kernels: every thread that walks the kv tiles (the sm80 kernel's,
// and the sm90 producer and consumers) computes the same sequence on its own. Include after variant.inc.
#pragma once

#include "attngen_common.cuh"
#include "block_parts.cuh"

namespace attngen {

// The kv tiles of q-block i of a (BQ x BK)-tiled kernel: [j_begin, j_end) less the classifier-EMPTY
// ones (and those outside every part's [lo, hi)) are visited, [f_lo, f_hi) are known FULL.
struct KvRange {
  int j_begin, j_end, f_lo, f_hi;
#if ATTNGEN_KV_PARTS
  int lo[ATTNGEN_KV_PARTS], hi[ATTNGEN_KV_PARTS];
#endif
};

template <int BQ, int BK>
ATTNGEN_DEV_INLINE KvRange kv_range(const CapturedArgs& C, const TileArgs& t, int i) {
  const int nkb = (t.KVLEN + BK - 1) / BK;
  KvRange r;
#if ATTNGEN_HAS_MASK
  r.j_begin = max(kv_block_lo<BQ, BK>(C, t, i), 0);
  r.j_end = min(kv_block_hi<BQ, BK>(C, t, i), nkb);
#if ATTNGEN_KV_PARTS
  // the parts' FULL runs stand in for the whole mask's, whose expression merges them all (far longer)
  int flo[ATTNGEN_KV_PARTS], fhi[ATTNGEN_KV_PARTS];
  kv_parts<BQ, BK>(C, t, i, r.lo, r.hi, flo, fhi);
  widest_full_run(flo, fhi, r.f_lo, r.f_hi);
#else
  r.f_lo = kv_full_lo<BQ, BK>(C, t, i);
  r.f_hi = kv_full_hi<BQ, BK>(C, t, i);
#endif
#else
  r.j_begin = 0;
  r.j_end = nkb;
  r.f_lo = 0;
  r.f_hi = nkb;
#endif
  return r;
}

// The first tile to visit at or after j (j_end when none): tiles outside every part of r (union masks)
// and tiles proven EMPTY by the classifier are skipped; tiles in the FULL range [f_lo, f_hi) never are.
// (The range's bounds come as plain ints, copies the caller keeps: reading them from r gives other SASS.)
template <int BQ, int BK>
ATTNGEN_DEV_INLINE int next_kv_tile(const CapturedArgs& C, const TileArgs& t, int i, int j, int j_end, int f_lo,
                                    int f_hi, const KvRange& r) {
#if ATTNGEN_HAS_MASK && ATTNGEN_KV_PARTS
  j = first_in_parts(r.lo, r.hi, j, j_end);
#endif
#if ATTNGEN_HAS_MASK && ATTNGEN_NEEDS_CLASSIFIER
  while (j < j_end && !(j >= f_lo && j < f_hi) && !tile_any<BQ, BK>(C, t, i, j)) {
#if ATTNGEN_KV_PARTS
    j = first_in_parts(r.lo, r.hi, j + 1, j_end);
#else
    ++j;
#endif
  }
#endif
  return j;
}

#if ATTNGEN_HAS_MASK && ATTNGEN_KV_PARTS
// About how many kv tiles q-block i of a union mask visits (the parts' spans, overlaps counted twice), for
// ordering work (fwd_sm90.cuh ascending_q_blocks).
template <int BQ, int BK>
ATTNGEN_DEV_INLINE int kv_tiles_estimate(const CapturedArgs& C, const TileArgs& t, int i) {
  const KvRange r = kv_range<BQ, BK>(C, t, i);
  int n = 0;
#pragma unroll
  for (int k = 0; k < ATTNGEN_KV_PARTS; ++k) n += max(0, min(r.hi[k], r.j_end) - max(r.lo[k], r.j_begin));
  return n;
}
#endif

}  // namespace attngen
