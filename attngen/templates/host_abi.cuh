// host_abi.cuh: the C ABI every kernel library exports to attngen/launch.py (attngen_abi_version,
// attngen_kernel_info, attngen_error_string, attngen_fwd), shared by the kernels. Return values are
// cudaError_t codes or the ATTNGEN_ERROR_* codes of attngen_common.cuh. The kernel source including
// this header defines the three functions declared below.
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

#include "attngen_common.cuh"

namespace {

AttngenKernelInfo kernel_info();                           // what attngen_kernel_info reports
bool accepts_scale(float scale);                           // false: ATTNGEN_ERROR_SCALE_NOT_POSITIVE
int launch(const AttngenFwdArgs& a, cudaStream_t stream);  // runs a call that passed attngen_fwd's checks

bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 16-byte vectors along the sequence: every stride that is actually stepped must keep 8-element
// (16-byte) alignment. A dimension of extent 1 is never stepped, so its stride does not matter.
bool strides_ok(const long long (&st)[3], long long n0, long long n1, long long n2) {
  return (n0 <= 1 || st[0] % 8 == 0) && (n1 <= 1 || st[1] % 8 == 0) && (n2 <= 1 || st[2] % 8 == 0);
}

// Per device, once: the kernel's opt-in shared-memory limit (per function and device context), and the
// SM count. `dev` is the current device.
template <typename Kernel>
cudaError_t prepare_device(Kernel* kernel, int smem_bytes, int& dev, int& sms) {
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

extern "C" ATTNGEN_EXPORT int attngen_kernel_info(AttngenKernelInfo* info) {
  if (info == nullptr) return (int)cudaErrorInvalidValue;
  *info = kernel_info();
  return (int)cudaSuccess;
}

extern "C" ATTNGEN_EXPORT const char* attngen_error_string(int code) {
  if (code == ATTNGEN_ERROR_SM90_TMA_LAYOUT)
    return "attngen sm90 kernel: q, k or v cannot be described by a TMA tensor map (batch/head/seq strides must be "
           "non-zero multiples of 16 bytes below 2^40 bytes, base pointers 16-byte aligned); run the sm80 kernel "
           "for this call, or pass contiguous tensors";
  if (code == ATTNGEN_ERROR_SM90_NO_TMA_ENCODER)
    return "attngen sm90 kernel: the CUDA driver does not provide cuTensorMapEncodeTiled (driver older than CUDA "
           "12.0); run the sm80 kernel, or update the NVIDIA driver";
  if (code == ATTNGEN_ERROR_SCALE_NOT_POSITIVE)
    return "attngen sm90 kernel: a variant without score_mod needs scale > 0 here (attngen's Python entry points "
           "pass -q and -scale for a negative scale)";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

#ifdef ATTNGEN_DEBUG_SLOT
// Debug builds only (ATTNGEN_DEBUG=1): the captured-tensor slot launch.py fills with the bounds record ag_chk writes
// (templates/variant_math.cuh); its presence tells launch.py the library is a debug build.
extern "C" ATTNGEN_EXPORT int attngen_debug_slot(void) { return ATTNGEN_DEBUG_SLOT; }
#endif

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
