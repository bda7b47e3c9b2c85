// block_parts.cuh: the walk over a union mask's ranges, one per disjunct (variant.inc's kv_parts /
// q_parts, ATTNGEN_KV_PARTS / ATTNGEN_Q_PARTS of them): local + global tokens visit the global columns and
// the band and jump the gap between them, rather than asking the classifier about every tile of the gap.
// Shared by block_range.cuh (the forward's walk) and block_range_bwd.cuh (its transpose).
#pragma once

#include "attngen_common.cuh"

namespace attngen {

// The first block at or after x inside some part's [lo, hi) (end when none). Parts may be empty (hi <= lo).
template <int P>
ATTNGEN_DEV_INLINE int first_in_parts(const int (&lo)[P], const int (&hi)[P], int x, int end) {
  int next = end;
#pragma unroll
  for (int k = 0; k < P; ++k) {
    const int c = max(x, lo[k]);
    if (c < hi[k]) next = min(next, c);
  }
  return next;
}

// One FULL run [f_lo, f_hi) from the parts' FULL ranges: overlapping or adjacent ones are merged, otherwise
// the widest stands (blocks of the other runs are then classified by tile_all, as any other tile).
template <int P>
ATTNGEN_DEV_INLINE void widest_full_run(const int (&flo)[P], const int (&fhi)[P], int& f_lo, int& f_hi) {
  f_lo = flo[0];
  f_hi = fhi[0];
#pragma unroll
  for (int k = 1; k < P; ++k) {
    if (fhi[k] <= flo[k]) continue;
    if (f_hi <= f_lo) {
      f_lo = flo[k];
      f_hi = fhi[k];
    } else if (flo[k] <= f_hi && f_lo <= fhi[k]) {
      f_lo = min(f_lo, flo[k]);
      f_hi = max(f_hi, fhi[k]);
    } else if (fhi[k] - flo[k] > f_hi - f_lo) {
      f_lo = flo[k];
      f_hi = fhi[k];
    }
  }
}

}  // namespace attngen
