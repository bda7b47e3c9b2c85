// fp8_v_transpose.cuh: the FP8 forward's V operand made on the GPU (exported by FP8 libraries only, as
// attngen_fp8_v_transpose): v (B, H, L, D) e4m3 -> V^T (B, H, D, ceil16(L)) contiguous, the kv columns of every 16
// placed by fp8_v_position (fwd_sm90.cuh), zeros past L. The same bytes as attngen/fp8.py's v_transposed (torch ops,
// the reference and the CPU path), in one pass over v: a CTA stages 64 kv rows x D bytes in shared memory with
// 16-byte loads and writes D rows of 64 bytes with 16-byte stores. Included by fwd_sm90.cuh after the kernel.
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

namespace {

constexpr int VT_ROWS = 64;                   // kv rows per CTA: 4 groups of 16
constexpr int VT_THREADS = 256;
constexpr int VT_PITCH = D + 16;              // staged row pitch in bytes (keeps 16-byte alignment)

// The kv column (0..15) whose byte sits at position p of a 16-column group: fp8_v_position's inverse.
ATTNGEN_HD constexpr int fp8_v_column(int p) { return 8 * ((p >> 1) & 1) + 2 * (p >> 2) + (p & 1); }
constexpr bool fp8_v_column_inverts_position() {
  for (int p = 0; p < 16; ++p)
    if (fp8_v_position(fp8_v_column(p)) != p) return false;
  return true;
}
static_assert(fp8_v_column_inverts_position(), "fp8_v_column inverts fp8_v_position");

__global__ void __launch_bounds__(VT_THREADS) attngen_fp8_v_transpose_kernel(
    const unsigned char* __restrict__ v, unsigned char* __restrict__ vt, int H, int L, int L16, long long s0,
    long long s1, long long s2) {
  __shared__ __align__(16) unsigned char tile[VT_ROWS * VT_PITCH];
  const int h = blockIdx.y, b = blockIdx.z, row0 = blockIdx.x * VT_ROWS;
  const unsigned char* src = v + (long long)b * s0 + (long long)h * s1;
  constexpr int CHUNKS = D / 16;  // 16-byte pieces of a row
  for (int c = threadIdx.x; c < VT_ROWS * CHUNKS; c += VT_THREADS) {
    const int r = c / CHUNKS, x = (c % CHUNKS) * 16, row = row0 + r;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row < L) val = __ldg(reinterpret_cast<const uint4*>(src + (long long)row * s2 + x));
    *reinterpret_cast<uint4*>(tile + r * VT_PITCH + x) = val;
  }
  __syncthreads();
  unsigned char* dst = vt + ((long long)b * H + h) * (long long)D * L16;
  constexpr int GROUPS = VT_ROWS / 16;
  for (int c = threadIdx.x; c < D * GROUPS; c += VT_THREADS) {
    const int d = c / GROUPS, g = c % GROUPS, col0 = row0 + 16 * g;
    if (col0 >= L16) continue;
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t word = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) word |= (uint32_t)tile[(16 * g + fp8_v_column(4 * q + i)) * VT_PITCH + d] << (8 * i);
      w[q] = word;
    }
    *reinterpret_cast<uint4*>(dst + (long long)d * L16 + col0) = make_uint4(w[0], w[1], w[2], w[3]);
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
