// sm90_tma.cuh: tensor-memory-accelerator (TMA) copies for sm90: the device-side bulk tensor copy into
// shared memory (completing on an mbarrier), the bulk reduce-add into global memory, and the host-side
// encoding of the tensor maps.
//
// Host side: cuTensorMapEncodeTiled is a driver API function. The library links no libcuda (cudart is
// static, the driver is found at run time), so the function is looked up through cudart's driver entry
// point query; <cuda.h> is included for the CUtensorMap type and enums only.
//
// Attention operands are (B, H, L, D) with element strides (batch, head, seq) and a contiguous last dim.
// They are described as 4-D tensors (D, L, H, B) (innermost first) with a box of 64 x rows x 1 x 1: one
// box is 64 head-dim columns (128 bytes, the widest box CU_TENSOR_MAP_SWIZZLE_128B allows) of `rows`
// consecutive sequence positions, written to shared memory as rows x 128 bytes with the 128-byte swizzle
// (16-byte chunk c of row r lands at chunk c ^ (r % 8)). A tile with head dim D takes D / 64 boxes at
// column coordinates 0, 64, ...; the kernel places them [D/64][rows][64] (see sm90_wgmma.cuh for why this
// is the canonical wgmma layout). Rows past L (and any coordinate outside the tensor) are zero-filled,
// and the transaction byte count still includes them (a full box is always delivered).
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

#include "attngen_common.cuh"

// CUtensorMap and the encoder's enums: from <cuda.h> (types only, no driver symbol is linked). Some
// toolkit installs (pip wheels) may ship cuda_runtime.h without cuda.h; the driver ABI below (CUDA 12.0,
// unchanged since) is then declared here.
#if defined(__has_include) && !defined(ATTNGEN_NO_CUDA_H)
#if __has_include(<cuda.h>)
#include <cuda.h>
#define ATTNGEN_HAVE_CUDA_H 1
#endif
#endif
#ifndef ATTNGEN_HAVE_CUDA_H
typedef int CUresult;
typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;
typedef struct CUtensorMap_st {
  alignas(128) cuuint64_t opaque[16];  // 64-byte alignment is what TMA needs; CUDA 13 uses 128
} CUtensorMap;
typedef enum { CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9 } CUtensorMapDataType;
typedef enum { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 } CUtensorMapInterleave;
typedef enum { CU_TENSOR_MAP_SWIZZLE_128B = 3 } CUtensorMapSwizzle;
typedef enum { CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 } CUtensorMapL2promotion;
typedef enum { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 } CUtensorMapFloatOOBfill;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_SUPPORTED 801
#endif

namespace attngen {

// ---------------------------------------------------------------------------------------------------
// device

// Bulk tensor copy of one box at coordinates (c0, c1, c2, c3) (innermost first, in elements) into shared
// memory at `smem_dst` (1024-byte aligned for the 128B swizzle), completing `bytes` on mbarrier `bar`.
// `tmap` is the address of a __grid_constant__ kernel parameter (param space, addressed generically).
__device__ __forceinline__ void tma_load_4d(uint32_t smem_dst, const CUtensorMap* tmap, uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_dst),
      "l"(reinterpret_cast<uint64_t>(tmap)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Bulk tensor copy of one box from shared memory at `smem_src` (laid out as tma_load_4d writes it) to the tensor at
// coordinates (c0, c1, c2, c3), in this thread's bulk async-group (commit with bulk_commit; bulk_wait_read before
// the source is written again). Box elements outside the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* tmap, uint32_t smem_src, int c0, int c1, int c2,
                                             int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(tmap)),
               "r"(smem_src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// Bulk copy of `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned) from global memory
// into shared memory at `smem_dst`, completing `bytes` on mbarrier `bar` (no tensor map: a 1-D row).
__device__ __forceinline__ void bulk_load_1d(uint32_t smem_dst, const void* gmem_src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_dst),
               "l"(reinterpret_cast<uint64_t>(gmem_src)), "r"(bytes), "r"(bar)
               : "memory");
}

// dst[0 .. bytes / 4) += src[0 .. bytes / 4) (float32): the TMA unit reads shared memory and adds into global
// memory (bytes a multiple of 16, both addresses 16-byte aligned), in this thread's bulk async-group: commit it
// with bulk_commit; wait with bulk_wait_read before the source is written again.
__device__ __forceinline__ void bulk_reduce_add_f32(float* gmem_dst, uint32_t smem_src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(gmem_dst)),
               "r"(smem_src), "r"(bytes)
               : "memory");
}
// dst[0 .. bytes) = src[0 .. bytes): the same copy as bulk_reduce_add_f32's without the addition.
__device__ __forceinline__ void bulk_store(void* gmem_dst, uint32_t smem_src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(reinterpret_cast<uint64_t>(gmem_dst)),
               "r"(smem_src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk async-groups, all but the newest N, have read their shared-memory sources.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// This thread's bulk async-groups are complete: their global writes are performed.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Pull a tensor map (kernel parameter) into the TMA unit's descriptor cache ahead of the first copy.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* tmap) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// ---------------------------------------------------------------------------------------------------
// host

typedef CUresult (*TmaEncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                     const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                     CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, or nullptr when the driver does not provide it (looked up once).
inline TmaEncodeTiledFn tma_encode_fn() {
  static const TmaEncodeTiledFn fn = []() -> TmaEncodeTiledFn {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12050
    // Ask for the CUDA 12.0 ABI of the function: the signature declared above.
    cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status);
#else
    cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &status);
#endif
    if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
      (void)cudaGetLastError();  // the failed query must not surface as a later launch error
      return nullptr;
    }
    return reinterpret_cast<TmaEncodeTiledFn>(p);
  }();
  return fn;
}

// The element types the maps describe, by AttngenKernelInfo.dtype code: 0 float16, 1 bfloat16, 2 e4m3 (bytes).
inline int tma_elem_bytes(int dtype_code) { return dtype_code == 2 ? 1 : 2; }
inline CUtensorMapDataType tma_data_type(int dtype_code) {
  return dtype_code == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                         : dtype_code == 1 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Encode the map of a (B, H, L, C) tensor at `base` (element type by dtype code, element strides `stride` =
// (batch, head, row)), boxes of one `box_bytes` row (128: 64 16-bit or 128 8-bit columns, 128-byte swizzle; 64:
// FP8's V^T at a BK that is no multiple of 128, 64-byte swizzle) x `box_rows` rows, zero fill out of bounds.
// Returns CUDA_SUCCESS or the driver's error (CUDA_ERROR_INVALID_VALUE for strides TMA cannot express: not a
// multiple of 16 bytes, zero, or >= 2^40 bytes; or a box_bytes other than 128 or 64), or CUDA_ERROR_NOT_SUPPORTED
// without an encoder. L == 0 is encoded as L = 1 (the kernel then never loads from the map).
inline CUresult tma_encode_bhld(CUtensorMap* map, const void* base, int dtype_code, int C, long long B, long long H,
                                long long L, const long long (&stride)[3], int box_rows, int box_bytes) {
  const TmaEncodeTiledFn encode = tma_encode_fn();
  if (encode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const long long elem = tma_elem_bytes(dtype_code);
  const long long row_bytes = elem * C;
  // A dimension of extent 1 is never stepped: its stride is free, and any valid value will do (torch may
  // report anything there, e.g. 1 for a size-1 dim).
  auto stride_bytes = [&](long long extent, long long st) -> cuuint64_t {
    return (cuuint64_t)(extent <= 1 ? row_bytes : elem * st);
  };
  for (int d = 0; d < 3; ++d) {
    if (stride[d] < 0) return CUDA_ERROR_INVALID_VALUE;
  }
  const cuuint64_t dims[4] = {(cuuint64_t)C, (cuuint64_t)(L > 0 ? L : 1), (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t strides[3] = {stride_bytes(L, stride[2]), stride_bytes(H, stride[1]), stride_bytes(B, stride[0])};
  if (box_bytes != 128 && box_bytes != 64) return CUDA_ERROR_INVALID_VALUE;
  const cuuint32_t box[4] = {(cuuint32_t)(box_bytes / elem), (cuuint32_t)box_rows, 1u, 1u};
  const cuuint32_t elem_strides[4] = {1u, 1u, 1u, 1u};
  const CUtensorMapSwizzle swizzle = box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  return encode(map, tma_data_type(dtype_code), 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

// The last map encoded for one role (Q, K or V) on this thread, with everything it was encoded from:
// calls on the same tensors (a benchmark loop, a cached decode buffer) skip the driver's encoder. A map is
// a self-contained 128-byte value, so reusing it is exact.
struct TmaMapMemo {
  const void* base = nullptr;
  long long B = -1, H = -1, L = -1, stride[3] = {-1, -1, -1};
  int C = -1, box_rows = -1, box_bytes = -1, dtype_code = -1;
  CUtensorMap map;
};

inline CUresult tma_encode_bhld_memo(TmaMapMemo& memo, CUtensorMap* map, const void* base, int dtype_code, int C,
                                     long long B, long long H, long long L, const long long (&stride)[3],
                                     int box_rows, int box_bytes = 128) {
  if (memo.base == base && memo.B == B && memo.H == H && memo.L == L && memo.stride[0] == stride[0] &&
      memo.stride[1] == stride[1] && memo.stride[2] == stride[2] && memo.C == C && memo.box_rows == box_rows &&
      memo.box_bytes == box_bytes && memo.dtype_code == dtype_code) {
    *map = memo.map;
    return CUDA_SUCCESS;
  }
  const CUresult r = tma_encode_bhld(map, base, dtype_code, C, B, H, L, stride, box_rows, box_bytes);
  if (r == CUDA_SUCCESS) {
    memo.map = *map;
    memo.base = base;
    memo.B = B; memo.H = H; memo.L = L;
    for (int d = 0; d < 3; ++d) memo.stride[d] = stride[d];
    memo.C = C; memo.box_rows = box_rows; memo.box_bytes = box_bytes; memo.dtype_code = dtype_code;
  } else {
    memo.base = nullptr;
  }
  return r;
}

// The maps of one attention call's q, k and v (B, H, L, D) (Q boxes of q_rows rows, K/V boxes of kv_rows
// rows), each re-encoded only when its tensor's address, shape or strides differ from this thread's
// previous call (of this library: `static`). An FP8 library's v is V^T (B, Hkv, D, ceil16(Lk)): boxes of `vt_cols`
// kv columns (one 128- or 64-byte swizzle row) x D rows, its columns up to ceil16(Lk) in the map, because the
// permutation of each 16 columns moves keys below Lk to positions beyond it. 0, or the attngen_fwd code that sends
// the call to the sm80 kernel.
static int tma_encode_qkv(const AttngenFwdArgs& a, int dtype_code, int D, int q_rows, int kv_rows, int vt_cols,
                          CUtensorMap& tm_q, CUtensorMap& tm_k, CUtensorMap& tm_v) {
  if (tma_encode_fn() == nullptr) return ATTNGEN_ERROR_SM90_NO_TMA_ENCODER;
  static thread_local TmaMapMemo memo_q, memo_k, memo_v;
  const bool v_transposed = dtype_code == 2;
  const int lk16 = (a.Lk + 15) & ~15;
  if (tma_encode_bhld_memo(memo_q, &tm_q, a.q, dtype_code, D, a.B, a.Hq, a.Lq, a.q_stride, q_rows) != CUDA_SUCCESS ||
      tma_encode_bhld_memo(memo_k, &tm_k, a.k, dtype_code, D, a.B, a.Hkv, a.Lk, a.k_stride, kv_rows) != CUDA_SUCCESS ||
      (v_transposed
           ? tma_encode_bhld_memo(memo_v, &tm_v, a.v, dtype_code, lk16, a.B, a.Hkv, D, a.v_stride, D, vt_cols)
           : tma_encode_bhld_memo(memo_v, &tm_v, a.v, dtype_code, D, a.B, a.Hkv, a.Lk, a.v_stride, kv_rows)) !=
          CUDA_SUCCESS)
    return ATTNGEN_ERROR_SM90_TMA_LAYOUT;
  return 0;
}

}  // namespace attngen
