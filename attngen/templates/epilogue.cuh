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

// The LSE a row stores: row_lse, or o_scale where that is NaN (FP8's invalid descale factors, fwd_sm90.cuh), so that
// the LSE says so too.
ATTNGEN_DEV_INLINE float stored_lse(float m, float c, float sum, float o_scale) {
  return o_scale == o_scale ? row_lse(m, c, sum) : o_scale;
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
      if (a.lse != nullptr && tig == 0) a.lse[lse_row0 + row] = stored_lse(m[rh], c, sum[rh], o_scale);
      store_row<Elem>(obase + (long long)row * a.o_stride[2] + tig * 2, o, rh, inv_or_zero(sum[rh]) * o_scale);
    }
  }
}

// stmatrix (sm_90): four 8 x 8 matrices of 16-bit elements from registers (each thread holding row lane / 4,
// columns 2 (lane % 4) and + 1 of matrix i in r[i], the mma accumulator layout) to shared memory, lane L giving the
// address of row L % 8 of matrix L / 8.
ATTNGEN_DEV_INLINE void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}

// This warp's 16 rows (warp w of a warpgroup: rows 16 w .. 16 w + 15) of a warpgroup's 64-row accumulator fragment
// o (N / 4 n8 chunks), row rh times inv[rh], into shared memory as tma_load_4d lays a box out (sm90_tma.cuh): column
// c in 128-byte block c / 64 (blocks `BLOCK_BYTES` apart from `rows`, the warpgroup's first row in block 0), row r
// at 128 r bytes, its 16-byte chunk (c % 64) / 8 at chunk ^ (r % 8); a 16 x 16 block per stmatrix (sm_90).
template <typename Elem, int N, int BLOCK_BYTES>
ATTNGEN_DEV_INLINE void stage_rows_sw128(uint32_t rows, const float (&o)[N], const float (&inv)[2], int warp,
                                         int lane) {
  static_assert(N % 8 == 0, "whole 16-column blocks");
  const int m = lane >> 3;  // the matrix this lane addresses: rows + 8 (m & 1), chunk + (m >> 1)
  const int r = lane & 7;   // its row in that matrix (the row's swizzle phase)
  const uint32_t row_addr = rows + (uint32_t)(warp * 16 + (m & 1) * 8 + r) * 128u;
#pragma unroll
  for (int n = 0; n < N / 4; n += 2) {  // n8 chunks n and n + 1: one 128-byte block (n even)
    const uint32_t v[4] = {pack2<Elem>(o[n * 4 + 0] * inv[0], o[n * 4 + 1] * inv[0]),
                           pack2<Elem>(o[n * 4 + 2] * inv[1], o[n * 4 + 3] * inv[1]),
                           pack2<Elem>(o[n * 4 + 4] * inv[0], o[n * 4 + 5] * inv[0]),
                           pack2<Elem>(o[n * 4 + 6] * inv[1], o[n * 4 + 7] * inv[1])};
    stmatrix_x4(row_addr + (n / 8) * BLOCK_BYTES + ((((n & 7) + (m >> 1)) ^ r) << 4), v);
  }
}

// The LSE of this thread's rows (as store_rows writes it) and their O, normalised, staged by stage_rows_sw128 for a
// TMA store of the warpgroup's rows.
template <typename Elem, int N, int BLOCK_BYTES>
ATTNGEN_DEV_INLINE void stage_rows(const AttngenFwdArgs& a, int b, int h, int QLEN, int row0, int tig, uint32_t rows,
                                   int warp, int lane, const float (&o)[N], const float (&m)[2], const float (&l)[2],
                                   float c, float o_scale = 1.f) {
  const float sum[2] = {quad_sum(l[0]), quad_sum(l[1])};
  const float inv[2] = {inv_or_zero(sum[0]) * o_scale, inv_or_zero(sum[1]) * o_scale};
  stage_rows_sw128<Elem, N, BLOCK_BYTES>(rows, o, inv, warp, lane);
  if (a.lse != nullptr && tig == 0) {
    const long long lse_row0 = ((long long)b * a.Hq + h) * QLEN;
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int row = row0 + rh * 8;
      if (row < QLEN) a.lse[lse_row0 + row] = stored_lse(m[rh], c, sum[rh], o_scale);
    }
  }
}

}  // namespace attngen
