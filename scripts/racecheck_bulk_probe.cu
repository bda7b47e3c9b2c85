// racecheck_bulk_probe.cu: does compute-sanitizer's racecheck follow an mbarrier that a 1-D bulk copy completes?
// The sm90 backward loads its row statistics with bulk_load_1d into a ring slot and its consumers read them with
// ordinary loads after mbar_wait on the slot's barrier; racecheck reports hazards between the two. This kernel is
// that pattern and nothing else, correct by construction: `probe` one copy, one barrier phase, every reader waiting
// on it; `probe_reuse` the slot refilled after its readers released it. Hazards here are the tool's.
//
//   nvcc -std=c++17 -arch=sm_90a -I attngen/templates scripts/racecheck_bulk_probe.cu -o /tmp/probe
//   compute-sanitizer --tool racecheck /tmp/probe
#include <cstdio>

#include "attngen_common.cuh"
#include "sm80_mma.cuh"  // smem_addr
#include "sm90_mbarrier.cuh"
#include "sm90_tma.cuh"

using namespace attngen;

__global__ void probe(const float* src, float* dst) {
  __shared__ __align__(128) float buf[64];
  __shared__ __align__(8) uint64_t bar;
  const uint32_t b = smem_addr(&bar);
  if (threadIdx.x == 0) {
    mbar_init(b, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(b, sizeof(buf));
    bulk_load_1d(smem_addr(buf), src, sizeof(buf), b);
  }
  mbar_wait(b, 0);
  dst[threadIdx.x] = buf[threadIdx.x];
}

// The ring's reuse: the slot is read (generic loads), released on an "empty" mbarrier, and only then refilled by
// the next bulk copy (write after read across proxies, ordered by the barrier's arrive / wait as in the backward).
__global__ void probe_reuse(const float* src, float* dst) {
  __shared__ __align__(128) float buf[64];
  __shared__ __align__(8) uint64_t full, empty;
  const uint32_t f = smem_addr(&full), e = smem_addr(&empty);
  if (threadIdx.x == 0) {
    mbar_init(f, 1);
    mbar_init(e, blockDim.x);
    mbar_fence_init();
  }
  __syncthreads();
  for (int it = 0; it < 2; ++it) {
    if (threadIdx.x == 0) {
      if (it > 0) mbar_wait(e, (it - 1) & 1);
      mbar_arrive_expect_tx(f, sizeof(buf));
      bulk_load_1d(smem_addr(buf), src + it * 64, sizeof(buf), f);
    }
    mbar_wait(f, it & 1);
    dst[it * 64 + threadIdx.x] = buf[threadIdx.x];
    mbar_arrive(e);
  }
}

// probe_reuse released as the backward releases a slot: the readers meet at a named barrier, then lane 0 of each
// warp arrives (the empty barrier counts warps, not threads).
__global__ void probe_reuse_by_warp(const float* src, float* dst) {
  __shared__ __align__(128) float buf[64];
  __shared__ __align__(8) uint64_t full, empty;
  const uint32_t f = smem_addr(&full), e = smem_addr(&empty);
  if (threadIdx.x == 0) {
    mbar_init(f, 1);
    mbar_init(e, blockDim.x / 32);
    mbar_fence_init();
  }
  __syncthreads();
  for (int it = 0; it < 2; ++it) {
    if (threadIdx.x == 0) {
      if (it > 0) mbar_wait(e, (it - 1) & 1);
      mbar_arrive_expect_tx(f, sizeof(buf));
      bulk_load_1d(smem_addr(buf), src + it * 64, sizeof(buf), f);
    }
    mbar_wait(f, it & 1);
    dst[it * 64 + threadIdx.x] = buf[threadIdx.x];
    named_bar_sync(1, blockDim.x);
    if ((threadIdx.x & 31) == 0) mbar_arrive(e);
  }
}

int main() {
  float *src, *dst;
  cudaMalloc(&src, 128 * sizeof(float));
  cudaMalloc(&dst, 128 * sizeof(float));
  float host[128];
  for (int i = 0; i < 128; ++i) host[i] = (float)i;
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  int bad = 0;
  probe<<<1, 64>>>(src, dst);
  cudaMemcpy(host, dst, 64 * sizeof(float), cudaMemcpyDeviceToHost);
  for (int i = 0; i < 64; ++i) bad += host[i] != (float)i;
  std::printf("racecheck_bulk_probe (one copy): %s\n", bad ? "WRONG VALUES" : "values ok");
  std::fflush(stdout);
  probe_reuse<<<1, 64>>>(src, dst);
  cudaMemcpy(host, dst, sizeof(host), cudaMemcpyDeviceToHost);
  for (int i = 0; i < 128; ++i) bad += host[i] != (float)i;
  std::printf("racecheck_bulk_probe (slot reused): %s\n", bad ? "WRONG VALUES" : "values ok");
  std::fflush(stdout);
  probe_reuse_by_warp<<<1, 64>>>(src, dst);
  cudaMemcpy(host, dst, sizeof(host), cudaMemcpyDeviceToHost);
  for (int i = 0; i < 128; ++i) bad += host[i] != (float)i;
  std::printf("racecheck_bulk_probe (slot reused, released by warp): %s\n", bad ? "WRONG VALUES" : "values ok");
  return bad != 0;
}
