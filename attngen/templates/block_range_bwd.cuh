// block_range_bwd.cuh: the transposed walk of the backward kernel: which q blocks kv-block j visits (EMPTY
// ones skipped) and which are known FULL (no mask_mod), from variant.inc's q_block_lo/q_block_hi/q_full_lo/
// q_full_hi and the classifier tile_any/tile_all (docs/kernel-interface.md), over the query heads that
// share one kv head; a union mask also skips the blocks outside every one of its parts (block_parts.cuh).
// Every thread computes the same sequence on its own. Include after variant.inc.
#pragma once

#include "attngen_common.cuh"
#include "block_parts.cuh"

namespace attngen {

// Where the walk stands: query head h (h == the end head: done), q-block i of that head's range
// [.., i_end), whose FULL range is [f_lo, f_hi).
struct QStep {
  int h, i, i_end, f_lo, f_hi;
#if ATTNGEN_Q_PARTS
  int lo[ATTNGEN_Q_PARTS], hi[ATTNGEN_Q_PARTS];
#endif
};

// Where kv-block j's walk over a range [lo, hi) of q blocks starts: lo + (shift * j) % (hi - lo); it visits
// [start, hi), then [lo, start). The kv blocks that share a range (a document's) then add into different dQ
// tiles at any one time rather than all into the same one (shift 0: no rotation).
ATTNGEN_DEV_INLINE int walk_rotation(int shift, int j, int lo, int hi) {
  return shift > 0 && hi - lo > 1 ? (int)((long long)shift * j % (hi - lo)) : 0;
}

// Head t.h's range of q blocks for kv-block j (clamped to [0, nqb)), starting the walk at its first block, or
// at its rotation's start (walk_rotation). The transpose of block_range.cuh's kv_range, kept apart: it reads the
// other four predicates of variant.inc.
template <int BQ, int BK>
ATTNGEN_DEV_INLINE QStep q_range(const CapturedArgs& C, const TileArgs& t, int j, int shift = 0) {
  const int nqb = (t.QLEN + BQ - 1) / BQ;
  QStep s;
  s.h = t.h;
#if ATTNGEN_HAS_MASK
  s.i = max(q_block_lo<BQ, BK>(C, t, j), 0);
  s.i_end = min(q_block_hi<BQ, BK>(C, t, j), nqb);
#if ATTNGEN_Q_PARTS
  int flo[ATTNGEN_Q_PARTS], fhi[ATTNGEN_Q_PARTS];
  q_parts<BQ, BK>(C, t, j, s.lo, s.hi, flo, fhi);
  widest_full_run(flo, fhi, s.f_lo, s.f_hi);
#else
  s.f_lo = q_full_lo<BQ, BK>(C, t, j);
  s.f_hi = q_full_hi<BQ, BK>(C, t, j);
#endif
#else
  s.i = 0;
  s.i_end = nqb;
  s.f_lo = 0;
  s.f_hi = nqb;
#endif
  s.i += walk_rotation(shift, j, s.i, s.i_end);
  return s;
}

// The first tile to visit at or after s (s itself when it is not proven EMPTY), moving on to the next heads
// up to h_end; s.h == h_end when none is left. tile_any / tile_all are symmetric in (i, j): the same
// classifier as the forward's. shift: the walk's rotation (walk_rotation), the one q_range was given for s (a
// plain range walked with shift > 0 would visit its first blocks twice): the second lap, [lo, start), follows the
// first.
template <int BQ, int BK>
ATTNGEN_DEV_INLINE QStep next_q_tile(const CapturedArgs& C, TileArgs t, int j, QStep s, int h_end, int shift = 0) {
  while (s.h < h_end) {
#if ATTNGEN_HAS_MASK && ATTNGEN_Q_PARTS
    s.i = first_in_parts(s.lo, s.hi, s.i, s.i_end);
#endif
#if ATTNGEN_HAS_MASK && ATTNGEN_NEEDS_CLASSIFIER
    t.h = s.h;
    while (s.i < s.i_end && !(s.i >= s.f_lo && s.i < s.f_hi) && !tile_any<BQ, BK>(C, t, s.i, j)) {
#if ATTNGEN_Q_PARTS
      s.i = first_in_parts(s.lo, s.hi, s.i + 1, s.i_end);
#else
      ++s.i;
#endif
    }
#endif
    if (s.i < s.i_end) return s;
    if (shift > 0) {  // a rotated walk's first lap ends at the range's end; the second ends where the first began
      t.h = s.h;
      const QStep r = q_range<BQ, BK>(C, t, j);
      const int rot = walk_rotation(shift, j, r.i, r.i_end);
      if (rot > 0 && s.i_end == r.i_end) {
        s.i = r.i;
        s.i_end = r.i + rot;
        continue;
      }
    }
    if (++s.h < h_end) {
      t.h = s.h;
      s = q_range<BQ, BK>(C, t, j, shift);
    }
  }
  return s;
}

// Whether kv-block j's walk visits q-block i of head t.h: next_q_tile's test for one tile (the deterministic
// backward orders the dQ additions of the kv blocks that do).
template <int BQ, int BK>
ATTNGEN_DEV_INLINE bool q_tile_visited(const CapturedArgs& C, const TileArgs& t, int i, int j) {
  const QStep s = q_range<BQ, BK>(C, t, j);
  if (i < s.i || i >= s.i_end) return false;
#if ATTNGEN_HAS_MASK && ATTNGEN_Q_PARTS
  if (first_in_parts(s.lo, s.hi, i, s.i_end) != i) return false;
#endif
#if ATTNGEN_HAS_MASK && ATTNGEN_NEEDS_CLASSIFIER
  if (!(i >= s.f_lo && i < s.f_hi) && !tile_any<BQ, BK>(C, t, i, j)) return false;
#endif
  return true;
}

// Whether visited tile (i, j) needs mask_mod: outside the FULL range and not proven FULL by tile_all.
template <int BQ, int BK>
ATTNGEN_DEV_INLINE bool q_tile_masked(const CapturedArgs& C, const TileArgs& t, const QStep& s, int j) {
  bool masked = false;
#if ATTNGEN_HAS_MASK
  masked = !(s.i >= s.f_lo && s.i < s.f_hi);
#if ATTNGEN_NEEDS_CLASSIFIER
  if (masked) masked = !tile_all<BQ, BK>(C, t, s.i, j);
#endif
#endif
  return masked;
}

}  // namespace attngen
