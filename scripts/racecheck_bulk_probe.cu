// racecheck_bulk_probe.cu: does compute-sanitizer's racecheck follow an mbarrier that a 1-D bulk copy completes?
// The sm90 backward loads its row statistics with bulk_load_1d into a ring slot and its consumers read them with
// ordinary loads after mbar_wait on the slot's barrier; racecheck reports hazards between the two. This kernel is
// that pattern and nothing else, correct by construction: `probe` one copy, one barrier phase, every reader waiting
// on it; `probe_reuse` the slot refilled after its readers released it; `probe_partial` with a producer warp beside
// the readers, as in the kernel. Hazards here are the tool's. Session 14 (H200, compute-sanitizer of CUDA 13.0):
// probe and probe_reuse clean; probe_partial, released per warp (after a named barrier of the readers only, or
// after __syncwarp), one hazard each; released by every reader thread, clean. The backward releases per thread.
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

// A ring slot's two mbarriers: full (the producer's arrive with the copy's bytes), empty (`releases` arrivals).
__device__ void init_slot_bars(uint32_t full, uint32_t empty, uint32_t releases) {
  if (threadIdx.x == 0) {
    mbar_init(full, 1);
    mbar_init(empty, releases);
    mbar_fence_init();
  }
  __syncthreads();
}

// The ring's reuse: the slot is read (generic loads), released on an "empty" mbarrier, and only then refilled by
// the next bulk copy (write after read across proxies, ordered by the barrier's arrive / wait). BY_WARP releases it
// as the backward did until session 14: the readers meet at a named barrier, then lane 0 of each warp arrives (the
// empty barrier counts warps, not threads).
template <bool BY_WARP>
__global__ void probe_reuse(const float* src, float* dst) {
  __shared__ __align__(128) float buf[64];
  __shared__ __align__(8) uint64_t full, empty;
  const uint32_t f = smem_addr(&full), e = smem_addr(&empty);
  init_slot_bars(f, e, BY_WARP ? blockDim.x / 32 : blockDim.x);
  for (int it = 0; it < 2; ++it) {
    if (threadIdx.x == 0) {
      if (it > 0) mbar_wait(e, (it - 1) & 1);
      mbar_arrive_expect_tx(f, sizeof(buf));
      bulk_load_1d(smem_addr(buf), src + it * 64, sizeof(buf), f);
    }
    mbar_wait(f, it & 1);
    dst[it * 64 + threadIdx.x] = buf[threadIdx.x];
    if (BY_WARP) named_bar_sync(1, blockDim.x);
    if (!BY_WARP || (threadIdx.x & 31) == 0) mbar_arrive(e);
  }
}

// The backward's arrangement until session 14: a producer warp (its lane 0 fills the slot and waits for it to be
// released) beside two reader warps that are the only members of the named barrier (a thread count below the
// block's) or, with SYNCWARP, release it per warp after __syncwarp alone. If racecheck reports hazards here but not
// in probe_reuse, it does not follow a named barrier over part of the block (or per-warp releases), and those
// hazards are the tool's.
// PER_THREAD (SYNCWARP ignored): every reader thread arrives itself, as the backward's consumers do.
template <bool SYNCWARP, bool PER_THREAD = false>
__global__ void probe_partial(const float* src, float* dst) {
  __shared__ __align__(128) float buf[64];
  __shared__ __align__(8) uint64_t full, empty;
  const uint32_t f = smem_addr(&full), e = smem_addr(&empty);
  init_slot_bars(f, e, PER_THREAD ? 64 : 2);  // one arrival per reader thread, or per reader warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (warp == 0) {
    if (lane == 0) {
      for (int it = 0; it < 2; ++it) {
        if (it > 0) mbar_wait(e, (it - 1) & 1);
        mbar_arrive_expect_tx(f, sizeof(buf));
        bulk_load_1d(smem_addr(buf), src + it * 64, sizeof(buf), f);
      }
    }
    return;
  }
  const int r = threadIdx.x - 32;
  for (int it = 0; it < 2; ++it) {
    mbar_wait(f, it & 1);
    dst[it * 64 + r] = buf[r];
    if (PER_THREAD) {
      mbar_arrive(e);
      continue;
    }
    if (SYNCWARP) __syncwarp();
    else named_bar_sync(1, 64);
    if (lane == 0) mbar_arrive(e);
  }
}

// One case: dst poisoned (NaN) before the launch, so a kernel that writes nothing fails; n values checked.
template <class Launch>
int run_case(const char* what, float* dst, int n, Launch launch) {
  std::fflush(stdout);
  cudaMemset(dst, 0xff, 128 * sizeof(float));
  launch();
  float host[128];
  cudaMemcpy(host, dst, n * sizeof(float), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < n; ++i) bad += host[i] != (float)i;
  std::printf("racecheck_bulk_probe (%s): %s\n", what, bad ? "WRONG VALUES" : "values ok");
  return bad;
}

int main() {
  float *src, *dst;
  cudaMalloc(&src, 128 * sizeof(float));
  cudaMalloc(&dst, 128 * sizeof(float));
  float host[128];
  for (int i = 0; i < 128; ++i) host[i] = (float)i;
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  int bad = run_case("one copy", dst, 64, [&] { probe<<<1, 64>>>(src, dst); });
  bad += run_case("slot reused", dst, 128, [&] { probe_reuse<false><<<1, 64>>>(src, dst); });
  bad += run_case("slot reused, released by warp", dst, 128, [&] { probe_reuse<true><<<1, 64>>>(src, dst); });
  bad += run_case("producer warp, readers released after a named barrier of 64 of 96 threads", dst, 128,
                  [&] { probe_partial<false><<<1, 96>>>(src, dst); });
  bad += run_case("producer warp, readers released per warp after __syncwarp", dst, 128,
                  [&] { probe_partial<true><<<1, 96>>>(src, dst); });
  bad += run_case("producer warp, every reader thread arrives", dst, 128,
                  [&] { probe_partial<false, true><<<1, 96>>>(src, dst); });
  return bad != 0;
}
