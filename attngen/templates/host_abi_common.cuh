// host_abi_common.cuh: the host side every kernel library shares (host_abi.cuh for the forward, host_abi_bwd.cuh
// for the backward): the alignment and stride checks, the once-per-device launch preparation, and the exports
// that do not depend on the kernel (attngen_abi_version, attngen_error_string, attngen_debug_slot).
#pragma once

#include <stdint.h>
#include <cuda_runtime.h>

#include "attngen_common.cuh"

namespace {

bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// 16-byte vectors along the sequence: every stride that is actually stepped must keep 8-element
// (16-byte) alignment. A dimension of extent 1 is never stepped, so its stride does not matter.
bool strides_ok(const long long (&st)[3], long long n0, long long n1, long long n2) {
  return (n0 <= 1 || st[0] % 8 == 0) && (n1 <= 1 || st[1] % 8 == 0) && (n2 <= 1 || st[2] % 8 == 0);
}

// The current device's primary context made current in this thread (a thread that has made no runtime call yet,
// such as autograd's backward thread, has none, and the driver calls of a launch, cuTensorMapEncodeTiled, need
// it); then, per device once, the kernel's opt-in shared-memory limit (per function and device context) and the
// SM count. `dev` is the current device. Call it before any driver API call of the launch.
template <typename Kernel>
cudaError_t prepare_device(Kernel* kernel, int smem_bytes, int& dev, int& sms) {
  constexpr int kDevices = 64;
  static bool ready[kDevices] = {};
  static int device_sms[kDevices] = {};
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  err = cudaSetDevice(dev);
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

#ifndef ATTNGEN_SECOND_UNIT  // a library's second translation unit (its KV-cache kernel) leaves these to the first
extern "C" ATTNGEN_EXPORT int attngen_abi_version(void) { return ATTNGEN_ABI_VERSION; }

extern "C" ATTNGEN_EXPORT const char* attngen_error_string(int code) {
  if (code == ATTNGEN_ERROR_SM90_TMA_LAYOUT)
    return "attngen sm90 kernel: q, k or v cannot be described by a TMA tensor map (batch/head/seq strides must be "
           "non-zero multiples of 16 bytes below 2^40 bytes, base pointers 16-byte aligned); run the sm80 kernel "
           "for this call, or pass contiguous tensors";
  if (code == ATTNGEN_ERROR_SM90_NO_TMA_ENCODER)
    return "attngen sm90 kernel: the CUDA driver does not provide cuTensorMapEncodeTiled (driver older than CUDA "
           "12.0); run the sm80 kernel, or update the NVIDIA driver";
  if (code == ATTNGEN_ERROR_BWD_OPTION)
    return "attngen backward kernel: this kernel family neither sums the gradients of captured tensors nor orders "
           "dQ's additions deterministically (the sm90 backward does both); attngen's autograd runs the float32 "
           "recompute for such calls instead";
  if (code == ATTNGEN_ERROR_SCALE_NOT_POSITIVE)
    return "attngen sm90 kernel: a variant without score_mod, or whose score_mod is a(q_idx - kv_idx) * score, needs "
           "scale > 0 here (attngen's Python entry points pass -q and -scale for a negative scale)";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

#ifdef ATTNGEN_DEBUG_SLOT
// Debug builds only (ATTNGEN_DEBUG=1): the captured-tensor slot launch.py fills with the bounds record ag_chk writes
// (templates/variant_math.cuh); its presence tells launch.py the library is a debug build.
extern "C" ATTNGEN_EXPORT int attngen_debug_slot(void) { return ATTNGEN_DEBUG_SLOT; }
#endif
#endif  // ATTNGEN_SECOND_UNIT
