// host_abi_bwd.cuh: the C ABI a backward library exports to attngen/launch.py (attngen_bwd_kernel_info and
// attngen_bwd with every input check; attngen_abi_version and attngen_error_string from host_abi_common.cuh).
// Return values are cudaError_t codes. The kernel source including this header defines the two functions
// declared below.
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

#include "attngen_common.cuh"
#include "attngen_bwd_abi.cuh"
#include "host_abi_common.cuh"

namespace {

AttngenKernelInfo bwd_kernel_info();                             // what attngen_bwd_kernel_info reports
int launch_bwd(const AttngenBwdArgs& a, cudaStream_t stream);   // runs a call that passed attngen_bwd's checks

}  // namespace

extern "C" ATTNGEN_EXPORT int attngen_bwd_kernel_info(AttngenKernelInfo* info) {
  if (info == nullptr) return (int)cudaErrorInvalidValue;
  *info = bwd_kernel_info();
  return (int)cudaSuccess;
}

extern "C" ATTNGEN_EXPORT int attngen_bwd(const AttngenBwdArgs* a, void* stream) {
  if (a == nullptr) return (int)cudaErrorInvalidValue;
  if (a->D != bwd_kernel_info().head_dim || a->B < 0 || a->Hq < 0 || a->Hkv < 0 || a->Lq < 0 || a->Lk < 0)
    return (int)cudaErrorInvalidValue;
  if (a->B == 0 || a->Hq == 0) return (int)cudaSuccess;  // nothing to write
  if (a->Hkv <= 0 || a->Hq % a->Hkv != 0) return (int)cudaErrorInvalidValue;
  if (a->B > 65535 || a->Hkv > 65535) return (int)cudaErrorInvalidConfiguration;  // the main grid's z / y limits
  if (a->lse == nullptr || a->dq_accum == nullptr || a->delta == nullptr || a->lse_log2 == nullptr)
    return (int)cudaErrorInvalidValue;
  const void* vec[] = {a->q, a->k, a->v, a->o, a->dout, a->dq, a->dk, a->dv, a->dq_accum, a->delta, a->lse_log2};
  for (const void* p : vec)
    if (!is_aligned16(p)) return (int)cudaErrorMisalignedAddress;
  if (!strides_ok(a->q_stride, a->B, a->Hq, a->Lq) || !strides_ok(a->o_stride, a->B, a->Hq, a->Lq) ||
      !strides_ok(a->do_stride, a->B, a->Hq, a->Lq) || !strides_ok(a->dq_stride, a->B, a->Hq, a->Lq) ||
      !strides_ok(a->k_stride, a->B, a->Hkv, a->Lk) || !strides_ok(a->v_stride, a->B, a->Hkv, a->Lk) ||
      !strides_ok(a->dk_stride, a->B, a->Hkv, a->Lk) || !strides_ok(a->dv_stride, a->B, a->Hkv, a->Lk))
    return (int)cudaErrorMisalignedAddress;
  return launch_bwd(*a, static_cast<cudaStream_t>(stream));
}
