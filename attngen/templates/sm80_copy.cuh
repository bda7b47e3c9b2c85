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
