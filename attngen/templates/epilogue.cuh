// epilogue.cuh: the end of a q-block: a row's softmax sum over its quad, O normalised by it, the
// natural-log LSE, and O written out. Rows with nothing kept (l == 0; a kept element contributes
// 2^0 = 1 at the row max) give O = 0 and LSE = -inf. Shared by the kernels (the accumulator layout
// is score_mask.cuh's).
#pragma once

#include "attngen_common.cuh"
#include "sm80_mma.cuh"  // pack2

namespace attngen {

// The sum of x over the quad of lanes sharing a row.
ATTNGEN_DEV_INLINE float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// 1 / sum, 0 for an empty row.
ATTNGEN_DEV_INLINE float inv_or_zero(float sum) { return sum > 0.f ? 1.f / sum : 0.f; }

// Natural-log LSE of a row, ln(sum_k e^{x_k}) = (c m + log2(sum)) * ln 2, from its running max m in the
// softmax domain of factor c (2^(c x) the weight; c = 1 where the scores are already in the log2 domain)
// and its quad-reduced sum of 2^(c (x - m)).
ATTNGEN_DEV_INLINE float row_lse(float m, float c, float sum) {
  return sum > 0.f ? (m * c + log2f(sum)) * LN2 : -INFINITY;
}

// Row rh (0: g, 1: g + 8) of an accumulator fragment o (N / 4 n8 chunks), times inv, to global memory
// at orow + 8 n + 2 tig (orow: the row's first column + 2 tig): straight from registers, a quad writing
// 16 contiguous bytes per 8 columns.
template <typename Elem, int N>
ATTNGEN_DEV_INLINE void store_row(Elem* orow, const float (&o)[N], int rh, float inv) {
#pragma unroll
  for (int n = 0; n < N / 4; ++n)
    *reinterpret_cast<uint32_t*>(orow + n * 8) = pack2<Elem>(o[n * 4 + rh * 2] * inv, o[n * 4 + rh * 2 + 1] * inv);
}

// This thread's rows of a finished q-block of batch b, head h: rows row0 and row0 + 8 (g and g + 8 of its
// m16 slice; rows past QLEN are skipped) of O (accumulator layout, normalised here by the quad-reduced
// partial sums l, times o_scale: FP8's v descale) and their LSE (from the lanes with tig 0; c is the softmax
// domain's factor).
template <typename Elem, int N>
ATTNGEN_DEV_INLINE void store_rows(const AttngenFwdArgs& a, int b, int h, int QLEN, int row0, int tig,
                                   const float (&o)[N], const float (&m)[2], const float (&l)[2], float c,
                                   float o_scale = 1.f) {
  const long long lse_row0 = ((long long)b * a.Hq + h) * QLEN;
  Elem* obase = static_cast<Elem*>(a.o) + (long long)b * a.o_stride[0] + (long long)h * a.o_stride[1];
  // Both rows' sums first: a shuffle issued behind a row's stores waits for them in the memory pipe.
  const float sum[2] = {quad_sum(l[0]), quad_sum(l[1])};
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int row = row0 + rh * 8;
    if (row < QLEN) {
      // o_scale is NaN only for FP8's invalid descale factors (fwd_sm90.cuh): the LSE says so too
      if (a.lse != nullptr && tig == 0)
        a.lse[lse_row0 + row] = o_scale == o_scale ? row_lse(m[rh], c, sum[rh]) : o_scale;
      store_row<Elem>(obase + (long long)row * a.o_stride[2] + tig * 2, o, rh, inv_or_zero(sum[rh]) * o_scale);
    }
  }
}

}  // namespace attngen
