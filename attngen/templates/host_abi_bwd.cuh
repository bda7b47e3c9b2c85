// host_abi_bwd.cuh: the C ABI a backward library exports to attngen/launch.py (attngen_abi_version,
// attngen_bwd_kernel_info, attngen_error_string, attngen_bwd with every input check). Return values are
// cudaError_t codes. The kernel source including this header defines the two functions declared below.
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

#include "attngen_common.cuh"
#include "attngen_bwd_abi.cuh"

namespace {

AttngenKernelInfo bwd_kernel_info();                             // what attngen_bwd_kernel_info reports
int launch_bwd(const AttngenBwdArgs& a, cudaStream_t stream);   // runs a call that passed attngen_bwd's checks

bool bwd_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 16-byte vectors along the sequence (as host_abi.cuh's strides_ok): every stepped stride a multiple of 8.
bool bwd_strides_ok(const long long (&st)[3], long long n0, long long n1, long long n2) {
  return (n0 <= 1 || st[0] % 8 == 0) && (n1 <= 1 || st[1] % 8 == 0) && (n2 <= 1 || st[2] % 8 == 0);
}

// Per device, once: the main kernel's opt-in shared-memory limit, and the SM count.
template <typename Kernel>
cudaError_t prepare_bwd_device(Kernel* kernel, int smem_bytes, int& dev, int& sms) {
  constexpr int kDevices = 64;
  static bool ready[kDevices] = {};
  static int device_sms[kDevices] = {};
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const bool cached = dev >= 0 && dev < kDevices;
  if (cached && ready[dev]) {
    sms = device_sms[dev];
    return cudaSuccess;
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return err;
  if (cached) {
    device_sms[dev] = sms;
    ready[dev] = true;
  }
  return cudaSuccess;
}

}  // namespace

extern "C" ATTNGEN_EXPORT int attngen_abi_version(void) { return ATTNGEN_ABI_VERSION; }

extern "C" ATTNGEN_EXPORT int attngen_bwd_kernel_info(AttngenKernelInfo* info) {
  if (info == nullptr) return (int)cudaErrorInvalidValue;
  *info = bwd_kernel_info();
  return (int)cudaSuccess;
}

extern "C" ATTNGEN_EXPORT const char* attngen_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

#ifdef ATTNGEN_DEBUG_SLOT
extern "C" ATTNGEN_EXPORT int attngen_debug_slot(void) { return ATTNGEN_DEBUG_SLOT; }
#endif

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
    if (!bwd_aligned16(p)) return (int)cudaErrorMisalignedAddress;
  if (!bwd_strides_ok(a->q_stride, a->B, a->Hq, a->Lq) || !bwd_strides_ok(a->o_stride, a->B, a->Hq, a->Lq) ||
      !bwd_strides_ok(a->do_stride, a->B, a->Hq, a->Lq) || !bwd_strides_ok(a->dq_stride, a->B, a->Hq, a->Lq) ||
      !bwd_strides_ok(a->k_stride, a->B, a->Hkv, a->Lk) || !bwd_strides_ok(a->v_stride, a->B, a->Hkv, a->Lk) ||
      !bwd_strides_ok(a->dk_stride, a->B, a->Hkv, a->Lk) || !bwd_strides_ok(a->dv_stride, a->B, a->Hkv, a->Lk))
    return (int)cudaErrorMisalignedAddress;
  return launch_bwd(*a, static_cast<cudaStream_t>(stream));
}
