// host_abi.cuh: the C ABI every forward library exports to attngen/launch.py (attngen_abi_version,
// attngen_kernel_info, attngen_error_string, attngen_fwd), shared by the forward kernels. Return values are
// cudaError_t codes or the ATTNGEN_ERROR_* codes of attngen_common.cuh. The kernel source including
// this header defines the three functions declared below.
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

#include "attngen_common.cuh"
#include "host_abi_common.cuh"

namespace {

AttngenKernelInfo kernel_info();                           // what attngen_kernel_info reports
bool accepts_scale(float scale);                           // false: ATTNGEN_ERROR_SCALE_NOT_POSITIVE
int launch(const AttngenFwdArgs& a, cudaStream_t stream);  // runs a call that passed attngen_fwd's checks

}  // namespace

extern "C" ATTNGEN_EXPORT int attngen_kernel_info(AttngenKernelInfo* info) {
  if (info == nullptr) return (int)cudaErrorInvalidValue;
  *info = kernel_info();
  return (int)cudaSuccess;
}

extern "C" ATTNGEN_EXPORT int attngen_fwd(const AttngenFwdArgs* a, void* stream) {
  if (a == nullptr) return (int)cudaErrorInvalidValue;
  if (a->D != kernel_info().head_dim || a->B < 0 || a->Hq < 0 || a->Lq < 0 || a->Lk < 0)
    return (int)cudaErrorInvalidValue;
  // The Python side turns scale < 0 into (-q, -scale) and scale == 0 into (0 * q, 1), both exact.
  if (!accepts_scale(a->scale)) return ATTNGEN_ERROR_SCALE_NOT_POSITIVE;
  if (a->B == 0 || a->Hq == 0 || a->Lq == 0) return (int)cudaSuccess;  // nothing to write
  if (a->Hkv <= 0 || a->Hq % a->Hkv != 0) return (int)cudaErrorInvalidValue;
  if (a->B > 65535 || a->Hq > 65535) return (int)cudaErrorInvalidConfiguration;  // the sm80 grid's z / y limits
  if (!is_aligned16(a->q) || !is_aligned16(a->k) || !is_aligned16(a->v) || !is_aligned16(a->o) ||
      !strides_ok(a->q_stride, a->B, a->Hq, a->Lq) || !strides_ok(a->k_stride, a->B, a->Hkv, a->Lk) ||
      !strides_ok(a->v_stride, a->B, a->Hkv, a->Lk) || !strides_ok(a->o_stride, a->B, a->Hq, a->Lq))
    return (int)cudaErrorMisalignedAddress;
  return launch(*a, static_cast<cudaStream_t>(stream));
}
