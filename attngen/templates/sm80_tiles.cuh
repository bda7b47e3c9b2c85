// sm80_tiles.cuh: the tiles of the two mma.sync kernels (fwd_sm80.cuh, bwd_sm80.cuh): padded shared-memory rows
// and their cp.async loader, the per-lane ldmatrix addresses of the three operand roles, zeroed accumulators and
// accumulators as A fragments. Fragment layouts: sm80_mma.cuh. The GEMM loops themselves stay in the kernels:
// moved into a shared function (even force-inlined) ptxas assigns registers differently.
#pragma once

#include <stdint.h>

#include "sm80_copy.cuh"
#include "sm80_mma.cuh"

namespace attngen {

// Rows of D 16-bit elements in shared memory, padded by 16 bytes so that 8 consecutive rows at one column
// start in 8 different 16-byte bank groups (row pitch = D/8 + 1 chunks, D/8 a multiple of 8): every 8x8
// ldmatrix phase and every 16-byte cp.async / store phase is conflict free, with no swizzle to get wrong.
// NTHREADS threads load them.
template <typename Elem, int D, int NTHREADS>
struct PaddedRows {
  static constexpr int PAD = 8;
  static constexpr int LDS = D + PAD;  // row pitch in elements
  static constexpr int ROW_BYTES = LDS * 2;
  static constexpr int CHUNKS_PER_ROW = D / 8;  // 16-byte chunks per row
  static constexpr int ROWS_PER_PASS = NTHREADS / CHUNKS_PER_ROW;

  static_assert(sizeof(Elem) == 2, "16-bit inputs only");
  static_assert(D % 64 == 0, "padding argument above assumes D/8 is a multiple of 8");
  static_assert(NTHREADS % CHUNKS_PER_ROW == 0, "tile loader assumes whole rows per pass");

  // Copy rows [row0, row0 + ROWS) of a row-major (nrows x D) matrix (row r at gbase + r * row_stride) into
  // smem[ROWS][LDS]. Rows >= nrows are zero-filled (and their source clamped to row 0, so no address outside
  // the tensor is ever formed). Each thread owns one 16-byte column chunk and every ROWS_PER_PASS-th row, so
  // a warp writes whole rows: coalesced 16-byte accesses.
  template <int ROWS>
  static __device__ __forceinline__ void load(uint32_t smem, const Elem* gbase, long long row_stride, int row0,
                                              int nrows, int tid) {
    static_assert(ROWS % ROWS_PER_PASS == 0, "tile loader assumes whole passes");
    const int chunk = tid % CHUNKS_PER_ROW;
    const int r_first = tid / CHUNKS_PER_ROW;
#pragma unroll
    for (int p = 0; p < ROWS / ROWS_PER_PASS; ++p) {
      const int r = r_first + p * ROWS_PER_PASS;
      const int grow = row0 + r;
      const bool valid = grow < nrows;
      const Elem* src = gbase + (long long)(valid ? grow : 0) * row_stride + chunk * 8;
      cp_async_16(smem + (uint32_t)(r * ROW_BYTES + chunk * 16), src, valid);
    }
  }
};

// Every accumulator of a fragment to 0.
template <int M, int N>
__device__ __forceinline__ void zero(float (&x)[M][N][4]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) x[m][n][r] = 0.f;
    }
  }
}

// Per-lane ldmatrix.x4 offsets (bytes) into rows ROW_BYTES apart.
//  A operand (one m16 x k16 block) from rows [row0, row0 + 16): lanes 0-15 rows 0-15 at k 0, lanes 16-31 at k 8.
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t lane_a(int lane, int row0) {
  return (uint32_t)((row0 + (lane & 15)) * ROW_BYTES + (lane >> 4) * 16);
}
//  B operand from rows along n (two n8 tiles x k16): matrices (n 0-7, k 0), (n 0-7, k 8), (n 8-15, k 0),
//  (n 8-15, k 8).
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t lane_b(int lane) {
  return (uint32_t)(((lane & 7) + ((lane >> 4) << 3)) * ROW_BYTES + ((lane >> 3) & 1) * 16);
}
//  B operand from rows along k, read with .trans (k16 x two n8 tiles), starting col_bytes into the row:
//  matrices (k 0-7, n 0), (k 8-15, n 0), (k 0-7, n 8), (k 8-15, n 8).
template <int ROW_BYTES>
__device__ __forceinline__ uint32_t lane_b_trans(int lane, int col_bytes = 0) {
  return (uint32_t)((lane & 15) * ROW_BYTES + (lane >> 4) * 16 + col_bytes);
}

// The accumulator pair (n8 tiles 2kc, 2kc+1) of an m16 slice is exactly the A fragment of k16 step kc:
// a0 = row g cols 2tig.. of tile 2kc, a1 = row g+8 of it, a2 / a3 = the same of tile 2kc+1.
template <typename Elem, int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&acc)[N][4], int kc) {
  a[0] = pack2<Elem>(acc[2 * kc][0], acc[2 * kc][1]);
  a[1] = pack2<Elem>(acc[2 * kc][2], acc[2 * kc][3]);
  a[2] = pack2<Elem>(acc[2 * kc + 1][0], acc[2 * kc + 1][1]);
  a[3] = pack2<Elem>(acc[2 * kc + 1][2], acc[2 * kc + 1][3]);
}

}  // namespace attngen
