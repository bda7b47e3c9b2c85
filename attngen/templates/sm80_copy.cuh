// sm80_copy.cuh: asynchronous global -> shared copies (cp.async, sm80+) and 16-byte global stores.
#pragma once

#include <stdint.h>

namespace attngen {

// Copy 16 bytes global -> shared without going through registers, bypassing L1 (.cg: K/V tiles are
// reused from shared memory, not L1). When `valid` is false nothing is read and the 16 destination
// bytes are zeroed instead: out-of-range rows must be zero, not stale data, because a masked P (= 0)
// times a stale NaN in V would still give NaN. The zeros are an ordinary shared store (not cp.async's
// src-size form); callers order both kinds of write before readers with the same barrier (__syncthreads(), or
// __syncwarp() where the warp that copied a row is the only one reading it).
// Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(uint32_t smem_addr, const void* gmem, bool valid) {
  if (valid) {
    const unsigned long long gaddr = static_cast<unsigned long long>(__cvta_generic_to_global(gmem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gaddr) : "memory");
  } else {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(smem_addr), "r"(0) : "memory");
  }
}

// cp_async_16 in one of the forms a streaming reader can pick (fwd_decode.cuh's KV_COPY): 0 .cg (bypass L1),
// 1 .ca (through L1), 2 .cg with a 256-byte L2 prefetch, 3 .cg under an L2 evict-first policy (`policy`, from
// createpolicy; read once).
template <int MODE>
__device__ __forceinline__ void cp_async_16_as(uint32_t smem_addr, const void* gmem, bool valid, uint64_t policy) {
  static_assert(MODE >= 0 && MODE <= 3, "copy forms 0..3");
  if (!valid) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(smem_addr), "r"(0) : "memory");
    return;
  }
  const unsigned long long gaddr = static_cast<unsigned long long>(__cvta_generic_to_global(gmem));
  if constexpr (MODE == 0) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gaddr) : "memory");
  } else if constexpr (MODE == 1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gaddr) : "memory");
  } else if constexpr (MODE == 2) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(smem_addr), "l"(gaddr) : "memory");
  } else {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gaddr),
                 "l"(policy) : "memory");
  }
}

// An L2 policy that evicts the lines it tags first (cp_async_16_as<3>).
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// Close the current group of cp.async operations (an empty group is legal and completes at once).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N of this thread's most recent groups are still in flight. Only this thread's
// copies are covered: a barrier must follow before other threads read the data (__syncthreads(), or __syncwarp()
// for rows only the copying warp reads).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 16-byte global store (st.global.v4.b32); `gmem` must be 16-byte aligned.
__device__ __forceinline__ void st_global_16(void* gmem, const uint4& v) {
  const unsigned long long gaddr = static_cast<unsigned long long>(__cvta_generic_to_global(gmem));
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(gaddr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

}  // namespace attngen
