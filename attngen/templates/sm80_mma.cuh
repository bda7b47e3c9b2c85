// sm80_mma.cuh: warp-level tensor-core primitives for sm80+ (mma.sync m16n8k16, ldmatrix, packing).
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"), with
// lane = 4 * groupID + tig (groupID = lane >> 2, tig = lane & 3):
//   A (16x16, row-major), 4 x b32, each the pair {col c, col c+1} (low half = lower column):
//     a0: row g,   cols 2*tig..+1        a1: row g+8, cols 2*tig..+1
//     a2: row g,   cols 2*tig+8..+9      a3: row g+8, cols 2*tig+8..+9
//   B (16x8, K x N), 2 x b32, each the pair {k, k+1} at column n = g:
//     b0: k = 2*tig..+1                  b1: k = 2*tig+8..+9
//   C/D (16x8 fp32): c0,c1: row g, cols 2*tig, 2*tig+1;  c2,c3: row g+8, same cols.
// ldmatrix.x4: lanes 8m..8m+7 give the 16-byte row addresses of matrix m (rows 0..7 in order); result
// register m holds matrix m, lane getting row g, cols 2*tig..+1 (with .trans: rows 2*tig..+1 of col g,
// i.e. the element pair runs down a column, which is the B layout when the stored rows are k).
#pragma once

#include <stdint.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace attngen {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// One 32-bit word of shared memory at a shared-space address; "memory" keeps them in order with the other accesses.
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_b32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Four 8x8 b16 matrices from shared memory (see the layout note above).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// Same, each matrix transposed on the way (used for V, stored kv-major, read as the B operand).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D = A * B + D for one m16n8k16 tile, fp32 accumulators. Elem selects the input type.
template <typename Elem>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                  uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> one b32 holding {lo, hi} in Elem (round to nearest even); lo lands in the low half,
// which is the lower column index in every fragment above.
template <typename Elem>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low 16 bits), .y = hi
  return *reinterpret_cast<uint32_t*>(&v);
}

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);  // .x = lo (low 16 bits), .y = hi
  return *reinterpret_cast<uint32_t*>(&v);
}

// The two halves of a pair packed by pack2 (.x the low 16 bits), as floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t x);

template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t x) {
  return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));  // a bf16 is its float's high half
}

template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t x) {
  return __half22float2(*reinterpret_cast<__half2*>(&x));
}

}  // namespace attngen
