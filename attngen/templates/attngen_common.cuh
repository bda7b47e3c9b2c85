// attngen_common.cuh: types shared by the generated variant.inc, the kernel templates and the host ABI.
//
// Everything here is plain C++ that both the host compiler and nvcc's device pass accept: the structs
// below ARE the C ABI (attngen/launch.py packs them byte for byte), so field order, types and sizes
// must only change together with ATTNGEN_ABI_VERSION and launch.py.
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// The ABI's facts, also stated in attngen/abi.py (tests/test_abi.py checks they agree).
// Bump ATTNGEN_ABI_VERSION whenever AttngenFwdArgs, CapturedArgs or AttngenKernelInfo change layout or meaning.
#define ATTNGEN_ABI_VERSION 4
#define ATTNGEN_MAX_CAPTURED 8
#define ATTNGEN_MAX_SUMMARIES 16
#define ATTNGEN_MAX_PARAMS 8
#define ATTNGEN_HEAD_DIMS {64, 128, 256}

// Return codes of attngen_fwd beyond cudaError_t (all cudaError_t values are below 10000 except
// cudaErrorApiFailureBase = 10000; these sit in between). The first two mean: this call cannot run on
// the sm90 kernel, run the sm80 kernel (same variant, same summaries sized by ITS block sizes) instead.
#define ATTNGEN_ERROR_SM90_TMA_LAYOUT 9001      // q/k/v cannot be described by a TMA tensor map
#define ATTNGEN_ERROR_SM90_NO_TMA_ENCODER 9002  // the driver does not provide cuTensorMapEncodeTiled
#define ATTNGEN_ERROR_SCALE_NOT_POSITIVE 9003   // scale <= 0 (or NaN) where the row max is over unscaled scores: score_mask.cuh
#define ATTNGEN_ERROR_BWD_OPTION 9004           // a backward asked for what only the sm90 one does (see host_abi_common)

// The libraries are ELF shared objects loaded by attngen/launch.py; only the C ABI is exported.
#define ATTNGEN_EXPORT __attribute__((visibility("default")))
// cuda_runtime.h defines the CUDA qualifiers as nothing for a host compiler, so these serve both.
#define ATTNGEN_HD __host__ __device__
#define ATTNGEN_DEV_INLINE __device__ __forceinline__

// Whether the kernels are built for head dim d (one of ATTNGEN_HEAD_DIMS).
constexpr bool attngen_head_dim_supported(int d) {
  constexpr int dims[] = ATTNGEN_HEAD_DIMS;
  for (int x : dims)
    if (x == d) return true;
  return false;
}

namespace attngen {
// An e4m3 floating-point byte (torch.float8_e4m3fn): the element type of the FP8 forward, which only moves
// these bytes (TMA, wgmma) and converts floats to them (cvt.rn.satfinite.e4m3x2.f32).
struct fp8_e4m3 {
  unsigned char bits;
};
// The kernels' softmax runs in the log2 domain (ex2.approx); LSE is reported in natural log.
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;
}  // namespace attngen

// Captured tensors and per-block summary arrays, filled by the host (launch.py) through the C ABI.
struct CapturedArgs {
  const void* ptr[ATTNGEN_MAX_CAPTURED];           // captured tensors, in TracedVariant.captured order
  long long stride[ATTNGEN_MAX_CAPTURED][4];       // element strides; dims beyond the rank are 0
  const void* summary[ATTNGEN_MAX_SUMMARIES];      // BlockPredicates.summaries order (int32 or float32)
  // Runtime parameters (TracedVariant.params, attngen/params.py): slot k is iparam[k] for an int parameter,
  // fparam[k] for a real one, so one library serves every window / cap / chunk size.
  int iparam[ATTNGEN_MAX_PARAMS];
  float fparam[ATTNGEN_MAX_PARAMS];
};

// Runtime facts the tile-level predicates are written in (q_idx = row + QOFF).
struct TileArgs {
  int QLEN, KVLEN, QOFF, b, h;
};

// The one argument block of `attngen_fwd`. Layout (x86-64 / aarch64, natural alignment, no padding):
//   offset   0  q, k, v, o, lse            5 pointers           (lse may be NULL: no LSE output)
//   offset  40  q_stride[3] .. o_stride[3] 4 x 3 int64          element strides (batch, head, seq)
//   offset 136  B, Hq, Hkv, Lq, Lk, D      6 int32
//   offset 160  scale (float32), q_offset (int32)
//   offset 168  captured                   CapturedArgs (512 bytes: 448 of tensors and summaries, then
//                                          8 int32 and 8 float32 runtime parameters)
//   offset 680  descale                    pointer (FP8 libraries only; NULL elsewhere)
//   size   688
struct AttngenFwdArgs {
  const void* q;        // (B, Hq, Lq, D), last dim contiguous
  const void* k;        // (B, Hkv, Lk, D)
  const void* v;        // (B, Hkv, Lk, D)
  void* o;              // (B, Hq, Lq, D), written in the input dtype
  float* lse;           // (B, Hq, Lq) contiguous float32, natural log; NULL to skip
  long long q_stride[3];
  long long k_stride[3];
  long long v_stride[3];
  long long o_stride[3];
  int B, Hq, Hkv, Lq, Lk, D;
  float scale;
  int q_offset;
  CapturedArgs captured;
  // FP8 (e4m3) libraries only: (3, B, Hkv) float32 contiguous, the q, k and v descale factors of each (batch, kv
  // head); their v is V^T, (B, Hkv, D, ceil16(Lk)) with the kv columns of every 16 permuted (fp8_v_position,
  // fwd_sm90.cuh) and v_stride its (batch, head, d-row) strides. 16-bit libraries ignore it.
  const float* descale;
};

// What a compiled library was built for; read once by launch.py at load time.
struct AttngenKernelInfo {
  int abi_version;
  int args_size;        // sizeof(AttngenFwdArgs): launch.py refuses a library whose layout differs
  int head_dim;
  int dtype;            // 0 = float16, 1 = bfloat16, 2 = float8_e4m3fn (bfloat16 output)
  int block_q;          // BQ: q rows per CTA (q-axis summaries have ceil(Lq / block_q) entries)
  int block_k;          // BK: kv rows per tile (kv-axis summaries have ceil(Lk / block_k) entries)
  int num_threads;
  int smem_bytes;       // dynamic shared memory per CTA
  int arch;             // e.g. 80, 90 (the __CUDA_ARCH__ the device code was built for, 0 if unknown)
};

#if defined(__cplusplus) && !defined(__CUDACC_RTC__)
static_assert(sizeof(CapturedArgs) == 512, "CapturedArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(CapturedArgs, iparam) == 448, "CapturedArgs layout is part of the C ABI");
static_assert(sizeof(AttngenFwdArgs) == 688, "AttngenFwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenFwdArgs, B) == 136, "AttngenFwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenFwdArgs, scale) == 160, "AttngenFwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenFwdArgs, captured) == 168, "AttngenFwdArgs layout is part of the C ABI");
#endif

// ---------------------------------------------------------------------------------------------------
// Python-semantics integer helpers (the predicates and mods are traced from Python, where // floors and
// % takes the divisor's sign). C++ `/` truncates toward zero, so correct the quotient when the
// remainder is non-zero and its sign differs from the divisor's. b == 0 is undefined (Python raises).
ATTNGEN_HD inline int py_floordiv(int a, int b) {
  int q = a / b;
  int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
ATTNGEN_HD inline int py_mod(int a, int b) {
  int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
ATTNGEN_HD inline long long py_floordiv(long long a, long long b) {
  long long q = a / b;
  long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? q - 1 : q;
}
ATTNGEN_HD inline long long py_mod(long long a, long long b) {
  long long r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// Mixed int / long long arguments resolve to the 64-bit overloads instead of being ambiguous.
ATTNGEN_HD inline long long py_floordiv(long long a, int b) { return py_floordiv(a, (long long)b); }
ATTNGEN_HD inline long long py_floordiv(int a, long long b) { return py_floordiv((long long)a, b); }
ATTNGEN_HD inline long long py_mod(long long a, int b) { return py_mod(a, (long long)b); }
ATTNGEN_HD inline long long py_mod(int a, long long b) { return py_mod((long long)a, b); }

// ---------------------------------------------------------------------------------------------------
// Element readers for captured tensors, usable by generated code: attngen_load_f32<T>(ptr, offset)
// reads element `offset` (in elements) of a tensor of storage type T as float; attngen_load_int<T>
// reads it as an integer (bool tensors are stored as one byte, read them with T = unsigned char).
#if defined(__CUDACC__)
template <typename T>
ATTNGEN_DEV_INLINE float attngen_to_f32(T x) { return static_cast<float>(x); }
template <>
ATTNGEN_DEV_INLINE float attngen_to_f32<__half>(__half x) { return __half2float(x); }
template <>
ATTNGEN_DEV_INLINE float attngen_to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
ATTNGEN_DEV_INLINE float attngen_load_f32(const void* ptr, long long offset) {
  return attngen_to_f32<T>(__ldg(static_cast<const T*>(ptr) + offset));
}
template <typename T>
ATTNGEN_DEV_INLINE long long attngen_load_int(const void* ptr, long long offset) {
  return static_cast<long long>(__ldg(static_cast<const T*>(ptr) + offset));
}
#endif
