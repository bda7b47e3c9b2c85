// variant_math.cuh: the ag_* device helpers that generated variant.inc code calls (attngen/printer.py
// prints the calls; variant.inc includes this header right after its attngen_common.cuh check).
//
// Every function is __forceinline__, so one a variant does not call is never emitted and costs nothing.
// All of them also compile for the host (the PTX fast paths sit behind __CUDA_ARCH__), so printed
// expressions can be checked with a host C++ compiler against Python (tests/test_printer.py,
// tests/test_codegen.py); such a compiler needs __host__/__device__/__forceinline__ defined away.
#pragma once

#include <math.h>
#include <string.h>

// Captured tensors are read-only for the whole launch: read them through the read-only data cache.
#ifndef AG_LDG
#ifdef __CUDA_ARCH__
#define AG_LDG(p) __ldg(p)
#else
#define AG_LDG(p) (*(p))
#endif
#endif

// ---- float functions with a fast path (CudaPrinter fast_tanh / fast_exp2, the default)

// tanh.approx.f32 (~2^-11 relative error): one hardware instruction instead of tanhf's sequence
__host__ __device__ __forceinline__ float ag_tanh(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  float y; asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
#else
  return tanhf(x);
#endif
}

// ex2.approx.ftz.f32; exp(x) prints as ag_exp2(x * log2(e))
__host__ __device__ __forceinline__ float ag_exp2(float x) {
#ifdef __CUDA_ARCH__
  float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y;
#else
  return exp2f(x);
#endif
}

// x ** -0.5 (torch.rsqrt); plain C++ has no rsqrtf
__host__ __device__ __forceinline__ float ag_rsqrt(float x) {
#ifdef __CUDA_ARCH__
  return rsqrtf(x);
#else
  return 1.0f / sqrtf(x);
#endif
}

// a / b of a score mod under fast_math: a times rcp.approx.ftz.f32 (one MUFU.RCP and, unless a is the literal 1,
// one FMUL; within 2 ulp). __fdividef would add a rescaling of |b| < 2^-126 per call, three instructions more;
// here such a b counts as 0 (a / b is +-inf, or NaN for a = 0) and |b| > 2^126 gives 0, as __fdividef does.
__host__ __device__ __forceinline__ float ag_fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  return a * r;
#else
  return a / b;
#endif
}

// ---- Python semantics that C spells differently

__host__ __device__ __forceinline__ int ag_min(int a, int b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ long long ag_min(long long a, long long b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ float ag_min(float a, float b) { return fminf(a, b); }
__host__ __device__ __forceinline__ int ag_max(int a, int b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ long long ag_max(long long a, long long b) { return a > b ? a : b; }
__host__ __device__ __forceinline__ float ag_max(float a, float b) { return fmaxf(a, b); }
__host__ __device__ __forceinline__ int ag_abs(int a) { return a < 0 ? -a : a; }
__host__ __device__ __forceinline__ long long ag_abs(long long a) { return a < 0 ? -a : a; }
// torch.sign: -1, 0 or 1; a float NaN (or zero) passes through, as torch's does
__host__ __device__ __forceinline__ int ag_sign(int a) { return (a > 0) - (a < 0); }
__host__ __device__ __forceinline__ long long ag_sign(long long a) { return (long long)((a > 0) - (a < 0)); }
__host__ __device__ __forceinline__ float ag_sign(float a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : a); }
// x ** n for a literal n > 4 (smaller powers of a symbol print as products)
__host__ __device__ __forceinline__ int ag_powi(int x, int n) { int r = 1; for (int k = 0; k < n; ++k) r *= x; return r; }
__host__ __device__ __forceinline__ long long ag_powi(long long x, int n) { long long r = 1; for (int k = 0; k < n; ++k) r *= x; return r; }
__host__ __device__ __forceinline__ float ag_powi(float x, int n) { float r = 1.0f; for (int k = 0; k < n; ++k) r *= x; return r; }

// Python float %: the result takes the divisor's sign
__host__ __device__ __forceinline__ float ag_fmod_py(float a, float b) {
  float r = fmodf(a, b);
  if (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) r += b;
  return r;
}

// torch indexing of a captured tensor: a negative index counts from the end (t[-1] is the last
// element). Codegen wraps only the indices it cannot prove non-negative; n is the dimension's size,
// baked in at trace time (CapturedTensor.wrapped_dims) and checked at every call.
__host__ __device__ __forceinline__ int ag_wrap(int i, int n) { return i < 0 ? i + n : i; }
__host__ __device__ __forceinline__ long long ag_wrap(long long i, long long n) { return i < 0 ? i + n : i; }

// Debug builds (ATTNGEN_DEBUG=1) check every captured-tensor index with ag_chk. `rec` is the debug record
// launch.py passes in captured slot ATTNGEN_DEBUG_SLOT: int32 sizes[ATTNGEN_MAX_CAPTURED][4], then the first
// out-of-range read as {flag, tensor, dim, index (saturated to int32)}. An index out of [0, size) is
// recorded and replaced by 0, so the kernel never reads out of bounds; launch.py raises InputError after it.
#define AG_DEBUG_RECORD (ATTNGEN_MAX_CAPTURED * 4)
__host__ __device__ __forceinline__ long long ag_chk(const void* rec, int n, int d, long long i) {
  int* r = (int*)rec;
  if (i >= 0 && i < (long long)r[n * 4 + d]) return i;
  const int saturated = i > 2147483647LL ? 2147483647 : i < -2147483647LL ? -2147483647 : (int)i;
#ifdef __CUDA_ARCH__
  if (atomicCAS(r + AG_DEBUG_RECORD, 0, 1) == 0) {
    r[AG_DEBUG_RECORD + 1] = n; r[AG_DEBUG_RECORD + 2] = d; r[AG_DEBUG_RECORD + 3] = saturated;
  }
#else
  if (r[AG_DEBUG_RECORD] == 0) {
    r[AG_DEBUG_RECORD] = 1; r[AG_DEBUG_RECORD + 1] = n; r[AG_DEBUG_RECORD + 2] = d; r[AG_DEBUG_RECORD + 3] = saturated;
  }
#endif
  return 0;
}

// ---- captured-tensor element loads: p + off (element offset), converted to the printer's value type

__host__ __device__ __forceinline__ float ag_ld_f32(const void* p, long long off) { return AG_LDG((const float*)p + off); }
__host__ __device__ __forceinline__ float ag_ld_f64(const void* p, long long off) { return (float)AG_LDG((const double*)p + off); }
__host__ __device__ __forceinline__ float ag_ld_bf16(const void* p, long long off) {
  unsigned int u = (unsigned int)AG_LDG((const unsigned short*)p + off) << 16;
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f; memcpy(&f, &u, 4); return f;
#endif
}
__host__ __device__ __forceinline__ float ag_ld_f16(const void* p, long long off) {
  unsigned short h = AG_LDG((const unsigned short*)p + off);
#ifdef __CUDA_ARCH__
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
#else
  unsigned int s = (h >> 15) & 1u, e = (h >> 10) & 31u, m = h & 1023u;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024u), (int)e - 25);
  return s ? -v : v;
#endif
}
__host__ __device__ __forceinline__ int ag_ld_i32(const void* p, long long off) { return AG_LDG((const int*)p + off); }
__host__ __device__ __forceinline__ long long ag_ld_i64(const void* p, long long off) { return AG_LDG((const long long*)p + off); }
__host__ __device__ __forceinline__ int ag_ld_i16(const void* p, long long off) { return AG_LDG((const short*)p + off); }
__host__ __device__ __forceinline__ int ag_ld_i8(const void* p, long long off) { return AG_LDG((const signed char*)p + off); }
__host__ __device__ __forceinline__ int ag_ld_u8(const void* p, long long off) { return AG_LDG((const unsigned char*)p + off); }
__host__ __device__ __forceinline__ int ag_ld_b8(const void* p, long long off) { return AG_LDG((const unsigned char*)p + off) != 0; }
