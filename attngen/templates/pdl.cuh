// pdl.cuh: programmatic dependent launch (sm_90). A kernel launched by launch_kernel(pdl = true, ...) may be
// scheduled while the kernel ahead of it on the stream drains, so that its launch and its shared-memory prologue hide
// under that kernel's tail instead of following it. Such a kernel calls pdl_wait() in every thread before its first
// global memory access, read or write: it returns once the grid ahead has completed and its writes are visible (the
// buffers a call reuses, such as a persistent grid's tile counter, are then free too). pdl_launch_dependents() lets
// the next such launch be scheduled once every CTA of this grid has called it or exited, that is once every CTA of
// this grid is resident, so calling it first thing takes no SM from this grid. Both take the library's switch (`on`)
// and compile to nothing without it, or below sm_90; in a kernel launched plainly they do nothing.
#pragma once

#include <cuda_runtime.h>

namespace attngen {

template <bool on>
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (on) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <bool on>
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (on) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) followed by cudaGetLastError(), through cudaLaunchKernelEx with the
// programmatic-serialization attribute when pdl: the launch's error, else any the runtime held, and the runtime's
// last error cleared either way (left set, it would surface at the next launch check, torch's among them, as that
// launch's).
template <typename... Params, typename... Args>
cudaError_t launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = pdl ? 1u : 0u;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
  const cudaError_t last = cudaGetLastError();
  return launched != cudaSuccess ? launched : last;
}

}  // namespace attngen
