// sm90_cluster.cuh: the few thread-block-cluster operations the backward's kv-block pairs use (sm_90): a CTA's rank,
// a barrier over the cluster's threads, another CTA's shared memory reached through distributed shared memory
// (addresses mapped with mapa, stores counted on the receiver's mbarrier), and mbarrier arrivals / waits whose
// release / acquire reach across the cluster.
#pragma once

#include <cstdint>

namespace attngen {

__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every non-exited thread of the cluster arrives and waits: shared memory written before it (mbarriers initialised
// included) is visible to the other CTAs after it, and no CTA leaves while another may still reach its shared memory.
// Not .aligned: a warp may come to it from diverged paths (the tile loader is one lane of its warp).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// The address of this CTA's shared-memory address `addr` in the CTA of rank `rank` (a shared::cluster address).
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

// Four floats into another CTA's shared memory (a mapped address), the bytes counted on that CTA's mbarrier
// `remote_bar` (its tx-count) when they land: no arrival, and no fence of the sender's, orders them.
__device__ __forceinline__ void st_async_v4(uint32_t addr, float a, float b, float c, float d, uint32_t remote_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_bar)
               : "memory");
}

// One arrival on an mbarrier of another CTA (a mapped address), from lane 0 of each warp after the warp's lanes have
// met (__syncwarp), ordered after the warp's earlier accesses cluster-wide: one release per warp, where one per thread
// costs a GPU-wide fence each. The lane test is a predicate in the instruction, not a branch around it (a branch there
// cost the consumers' registers).
__device__ __forceinline__ void mbar_arrive_cluster_per_warp(uint32_t remote_bar, uint32_t lane) {
  __syncwarp();
  asm volatile(
      "{\n.reg .pred p;\nsetp.eq.u32 p, %1, 0;\n"
      "@p mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n}\n" ::"r"(remote_bar), "r"(lane)
      : "memory");
}

// Wait on this CTA's mbarrier for a phase that other CTAs' arrivals complete: what they wrote before arriving is
// visible after it.
__device__ __forceinline__ void mbar_wait_cluster(uint32_t bar, uint32_t parity) {
  uint32_t ok = 0;
  while (!ok) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

}  // namespace attngen
