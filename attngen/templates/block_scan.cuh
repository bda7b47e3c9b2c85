// block_scan.cuh: the walks' search for the next tile to visit when the classifier must be asked about every
// candidate (block_range.cuh, block_range_bwd.cuh): a whole warp asks about 32 candidates at once. A range that
// does not move with the walking block (variant.inc's ATTNGEN_KV_WALK_SCANS / ATTNGEN_Q_WALK_SCANS) otherwise
// costs one classifier question per EMPTY tile crossed, before the first tile and after the last.
#pragma once

#include "attngen_common.cuh"

#ifndef ATTNGEN_KV_WALK_SCANS  // hand-written variant.inc files (tests/data) that predate the warp's walk
#define ATTNGEN_KV_WALK_SCANS 0
#endif
#ifndef ATTNGEN_Q_WALK_SCANS
#define ATTNGEN_Q_WALK_SCANS 0
#endif

namespace attngen {

// The first of the 32 candidates x + lane (lane 0 .. 31) below end that visit holds for: its lane, or 32 when
// none. The warp's ballot; tests/test_block_walk.py runs the walks on the host, where the lanes take turns.
template <class Visit>
ATTNGEN_DEV_INLINE int first_candidate(int x, int end, const Visit& visit) {
#ifdef ATTNGEN_HOST_WARP
  for (int lane = 0; lane < 32; ++lane)
    if (x + lane < end && visit(x + lane)) return lane;
  return 32;
#else
  const int c = x + (int)(threadIdx.x & 31u);
  const unsigned hit = __ballot_sync(0xffffffffu, c < end && visit(c));
  return hit != 0u ? __ffs((int)hit) - 1 : 32;
#endif
}

// The first block x' >= skip(x) below end that visit(x') holds for, or end. skip(x) is the first block at or
// after x worth asking about (end when none: union masks jump the gaps between their parts). Every lane of the
// warp calls it, converged, with the same x and end, and all return the same block; visit is asked only below end.
template <class Skip, class Visit>
ATTNGEN_DEV_INLINE int warp_first(int x, int end, const Skip& skip, const Visit& visit) {
  for (x = skip(x); x < end; x = skip(x + 32)) {
    const int lane = first_candidate(x, end, visit);
    if (lane < 32) return x + lane;
  }
  return end;
}

}  // namespace attngen
