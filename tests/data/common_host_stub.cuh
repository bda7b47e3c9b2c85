// Host (g++) stand-in for attngen/templates/attngen_common.cuh: exactly the declarations of
// docs/kernel-interface.md, without CUDA headers, so printed expressions can be run on the CPU.
#pragma once
#define ATTNGEN_MAX_CAPTURED 8
#define ATTNGEN_MAX_SUMMARIES 16
#define ATTNGEN_MAX_PARAMS 8
struct CapturedArgs {
  const void* ptr[ATTNGEN_MAX_CAPTURED];
  long long   stride[ATTNGEN_MAX_CAPTURED][4];
  const void* summary[ATTNGEN_MAX_SUMMARIES];
  int iparam[ATTNGEN_MAX_PARAMS];
  float fparam[ATTNGEN_MAX_PARAMS];
};
struct TileArgs { int QLEN, KVLEN, QOFF, b, h; };
__host__ __device__ inline int py_floordiv(int a, int b) { int q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
__host__ __device__ inline int py_mod(int a, int b) { int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
__host__ __device__ inline long long py_floordiv(long long a, long long b) { long long q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
__host__ __device__ inline long long py_mod(long long a, long long b) { long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
