// fp8_v_transpose.cuh: the FP8 forward's V operand made on the GPU (exported by FP8 libraries only, as
// attngen_fp8_v_transpose): v (B, H, L, D) e4m3 -> V^T (B, H, D, ceil16(L)) contiguous, the kv columns of every 16
// placed by fp8_v_position (fwd_sm90.cuh), zeros past L. The same bytes as attngen/fp8.py's v_transposed (torch ops,
// the reference and the CPU path), in one pass over v: a CTA stages 128 kv rows x D bytes in shared memory with
// 16-byte loads and writes D rows of 128 bytes with 16-byte stores. Included by fwd_sm90.cuh after the kernel.
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

namespace {

constexpr int VT_ROWS = 128;                  // kv rows per CTA: 8 groups of 16
constexpr int VT_THREADS = 256;               // one (4 d rows, 16-column group) piece each
constexpr int VT_PITCH_WORDS = D / 4 + 4;     // staged row pitch (16-byte aligned)
static_assert(VT_THREADS == (D / 4) * (VT_ROWS / 16), "one piece per thread");
// Where staged row r starts, in words: each 16-row group 4 words further on, so that the 8 groups' reads of a row
// (k of each group, one word) fall in distinct banks: bank 4 k + 4 g + dq (mod 32).
ATTNGEN_HD constexpr int vt_row_word(int r) { return r * VT_PITCH_WORDS + 4 * (r / 16); }
constexpr int VT_TILE_WORDS = vt_row_word(VT_ROWS);

// The kv column (0..15) whose byte sits at position p of a 16-column group: fp8_v_position's inverse.
ATTNGEN_HD constexpr int fp8_v_column(int p) { return 8 * ((p >> 1) & 1) + 2 * (p >> 2) + (p & 1); }
constexpr bool fp8_v_column_inverts_position() {
  for (int p = 0; p < 16; ++p)
    if (fp8_v_position(fp8_v_column(p)) != p) return false;
  return true;
}
static_assert(fp8_v_column_inverts_position(), "fp8_v_column inverts fp8_v_position");
// Positions 4 q .. 4 q + 3 hold columns 2 q, 2 q + 1, 2 q + 8, 2 q + 9: what the byte transpose below reads.
constexpr bool fp8_v_word_columns() {
  for (int q = 0; q < 4; ++q)
    if (fp8_v_column(4 * q) != 2 * q || fp8_v_column(4 * q + 1) != 2 * q + 1 || fp8_v_column(4 * q + 2) != 2 * q + 8 ||
        fp8_v_column(4 * q + 3) != 2 * q + 9)
      return false;
  return true;
}
static_assert(fp8_v_word_columns(), "each 4-byte word of V^T gathers columns 2q, 2q+1, 2q+8, 2q+9");

// A CTA stages 128 kv rows x D bytes in shared memory with 16-byte loads (zeros past L); each thread then reads one
// 4-byte word (d rows 4 dq .. 4 dq + 3) of the 16 rows of its column group, transposes them as 4 x 4 byte blocks
// with byte permutes, and writes 16 bytes to each of its 4 V^T rows (the 8 groups of a row: 128 contiguous bytes).
__global__ void __launch_bounds__(VT_THREADS) attngen_fp8_v_transpose_kernel(
    const unsigned char* __restrict__ v, unsigned char* __restrict__ vt, int H, int L, int L16, long long s0,
    long long s1, long long s2) {
  __shared__ __align__(16) uint32_t tile[VT_TILE_WORDS];
  const int h = blockIdx.y, b = blockIdx.z, row0 = blockIdx.x * VT_ROWS;
  pdl_launch_dependents<PDL>();  // the attention kernel that reads V^T may be scheduled now; it waits for this grid (pdl.cuh)
  const unsigned char* src = v + (long long)b * s0 + (long long)h * s1;
  constexpr int CHUNKS = D / 16;  // 16-byte pieces of a row
  for (int c = threadIdx.x; c < VT_ROWS * CHUNKS; c += VT_THREADS) {
    const int r = c / CHUNKS, x = c % CHUNKS, row = row0 + r;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row < L) val = __ldg(reinterpret_cast<const uint4*>(src + (long long)row * s2 + 16 * x));
    *reinterpret_cast<uint4*>(tile + vt_row_word(r) + 4 * x) = val;
  }
  __syncthreads();
  const int g = threadIdx.x % 8, dq = threadIdx.x / 8, col0 = row0 + 16 * g;
  if (col0 >= L16) return;
  uint32_t w[16];  // row k of the group, d rows 4 dq .. 4 dq + 3
#pragma unroll
  for (int k = 0; k < 16; ++k) w[k] = tile[vt_row_word(16 * g + k) + dq];
  uint32_t out[4][4];  // [byte i of the words: d row 4 dq + i][word q of its 16 bytes]
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // rows r0..r3 = 2q, 2q + 1, 2q + 8, 2q + 9; ri.j is byte j (d row 4 dq + j) of row ri's word
    const uint32_t r0 = w[2 * q], r1 = w[2 * q + 1], r2 = w[2 * q + 8], r3 = w[2 * q + 9];
    const uint32_t t0 = __byte_perm(r0, r1, 0x5140), t1 = __byte_perm(r0, r1, 0x7362);  // r0.0 r1.0 r0.1 r1.1 | .2 .3
    const uint32_t t2 = __byte_perm(r2, r3, 0x5140), t3 = __byte_perm(r2, r3, 0x7362);  // r2.0 r3.0 r2.1 r3.1 | .2 .3
    out[0][q] = __byte_perm(t0, t2, 0x5410);  // r0.0 r1.0 r2.0 r3.0
    out[1][q] = __byte_perm(t0, t2, 0x7632);
    out[2][q] = __byte_perm(t1, t3, 0x5410);
    out[3][q] = __byte_perm(t1, t3, 0x7632);
  }
  unsigned char* dst = vt + ((long long)b * H + h) * (long long)D * L16 + col0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint4 row = make_uint4(out[i][0], out[i][1], out[i][2], out[i][3]);
    *reinterpret_cast<uint4*>(dst + (long long)(4 * dq + i) * L16) = row;
  }
}

}  // namespace

// v (B, H, L, D) e4m3 with byte strides (s0, s1, s2) (last dim contiguous, every stepped stride 16-byte aligned)
// -> vt, a contiguous (B, H, D, ceil16(L)) buffer, on `stream`. Returns a cudaError_t code.
extern "C" ATTNGEN_EXPORT int attngen_fp8_v_transpose(const void* v, void* vt, int B, int H, int L, long long s0,
                                                      long long s1, long long s2, void* stream) {
  if (B < 0 || H < 0 || L < 0 || v == nullptr || vt == nullptr) return (int)cudaErrorInvalidValue;
  if ((reinterpret_cast<uintptr_t>(v) & 15u) || (reinterpret_cast<uintptr_t>(vt) & 15u) || (B > 1 && s0 % 16 != 0) ||
      (H > 1 && s1 % 16 != 0) || (L > 1 && s2 % 16 != 0))
    return (int)cudaErrorMisalignedAddress;
  if (B == 0 || H == 0 || L == 0) return (int)cudaSuccess;
  if (B > 65535 || H > 65535) return (int)cudaErrorInvalidConfiguration;
  const int L16 = (L + 15) & ~15;
  const dim3 grid((unsigned)((L16 + VT_ROWS - 1) / VT_ROWS), (unsigned)H, (unsigned)B);
  attngen_fp8_v_transpose_kernel<<<grid, VT_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const unsigned char*>(v), static_cast<unsigned char*>(vt), H, L, L16, s0, s1, s2);
  return (int)cudaGetLastError();
}
