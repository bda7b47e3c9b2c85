// sm90_mbarrier.cuh: CTA-level synchronization for the warp-specialized sm90 kernel: shared-memory
// mbarriers (transaction counts for TMA, arrival counts for consumers) and named barriers (bar.sync /
// bar.arrive between warpgroups).
//
// mbarrier phases: a barrier starts in phase 0 with `count` pending arrivals (and 0 pending transaction
// bytes). A phase completes when both reach 0; the barrier then moves to the next phase and reloads the
// arrival count. try_wait.parity(P) succeeds once the phase with parity P has completed, i.e. while the
// current phase's parity differs from P. Hence, for a ring slot used for the n-th time (n = 0, 1, ...):
//   consumers wait on "full"  with parity (n & 1)       (the n-th fill completed),
//   the producer waits on "empty" with parity (n & 1) ^ 1 (passes at once for n = 0: the phase "before"
//   phase 0 counts as complete).
#pragma once

#include <stdint.h>

namespace attngen {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes initialized barriers visible to the other threads and to the async proxy (TMA complete_tx);
// follow it with a CTA barrier before any other thread uses them.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `tx_bytes` bytes the TMA unit will deliver (complete_tx) this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t tx_bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(tx_bytes) : "memory");
}

// One plain arrival (release semantics: this thread's earlier memory accesses are ordered before it).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

// Whether the phase with parity `parity` has completed, without suspending the thread (try_wait may wait out its
// time limit first).
__device__ __forceinline__ bool mbar_test_wait(uint32_t bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

// Block until the phase with parity `parity` has completed (acquire: data it guards is then visible).
// try_wait already suspends the thread for a system-dependent time before returning false.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// try_wait with a suspend-time hint: the thread may stay suspended up to `ns` nanoseconds, woken when the phase
// completes, so that a wait lasting a whole walk polls the barrier a few times rather than once per default time
// limit (each poll an issued instruction beside the consumers' on the same scheduler).
__device__ __forceinline__ bool mbar_try_wait_for(uint32_t bar, uint32_t parity, uint32_t ns) {
  uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity), "r"(ns)
      : "memory");
  return ok != 0;
}

// mbar_wait with that hint (NS = 0: mbar_wait itself).
template <uint32_t NS>
__device__ __forceinline__ void mbar_wait_for(uint32_t bar, uint32_t parity) {
  if constexpr (NS == 0) {
    mbar_wait(bar, parity);
  } else {
    while (!mbar_try_wait_for(bar, parity, NS)) {
    }
  }
}

// Named barriers (ids 1..15; 0 is __syncthreads). `nthreads` counts every participating thread (a
// multiple of 32): sync waits until that many have arrived (itself included), arrive only counts.
__device__ __forceinline__ void named_bar_sync(uint32_t id, uint32_t nthreads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(uint32_t id, uint32_t nthreads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// Orders this thread's generic-proxy shared-memory accesses with later async-proxy ones (TMA, wgmma).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

}  // namespace attngen
