// attngen_bwd_abi.cuh: the argument block of `attngen_bwd` (the backward libraries' C ABI; the forward's
// AttngenFwdArgs in attngen_common.cuh is untouched). attngen/launch.py packs it byte for byte: field order,
// types and sizes change only together with ATTNGEN_BWD_ABI_VERSION and launch.py.
#pragma once

#include "attngen_common.cuh"

#define ATTNGEN_BWD_ABI_VERSION 8

// Layout (x86-64 / aarch64, natural alignment, no padding):
//   offset   0  q, k, v, o, dout, lse         6 pointers
//   offset  48  dq, dk, dv                    3 pointers           outputs, input dtype
//   offset  72  dq_accum, delta, lse_log2     3 pointers           fp32 workspaces allocated by launch.py
//   offset  96  q_stride[3] .. dv_stride[3]   8 x 3 int64          element strides (batch, head, seq)
//   offset 288  B, Hq, Hkv, Lq, Lk, D         6 int32
//   offset 312  scale (float32), q_offset (int32)
//   offset 320  captured                      CapturedArgs (512 bytes)
//   offset 832  dcaptured[ATTNGEN_MAX_CAPTURED] pointers           fp32 gradients of the captured tensors
//   offset 896  dq_semaphore                  pointer              deterministic mode's turn counters
//   offset 904  tile_counter                  pointer              the persistent sm90 kernel's work-tile counter
//   offset 912  dq_written                    pointer              which chunks of dq_accum hold a first write
//   offset 920  tile_order                    pointer              the order the sm90 kernel takes its work tiles in
//   size   928
// Workspaces: dq_accum B * Hq * Lq_pad * D floats, laid out as the kernel family chooses (row-major, or tiled
// by q-block: sm90_bwd_layout.cuh); delta and lse_log2 (B, Hq, Lq_pad) contiguous with
// Lq_pad = ceil(Lq / block_q) * block_q (AttngenKernelInfo.block_q), so that every q-block's slice is whole
// and 16-byte aligned. Each call writes all three before reading them (dq_accum: see dq_written).
// dcaptured[i]: null, or a zeroed fp32 buffer laid out with captured.stride[i] that the sm90 kernel adds tensor
// i's gradient to (bwd_grad_sites.cuh); dq_semaphore: null, or zeroed int32 (B, Hq, ceil(Lq / block_q)) that
// makes the sm90 kernel add dQ in kv-block order (deterministic mode). The sm80 kernel takes only nulls in both.
// tile_counter: null, or one int32 the preprocess zeroes and the sm90 kernel's persistent CTAs take their work
// tiles from (ignored by the sm80 kernel). dq_written: null, or int32 (B, Hq, ceil(Lq / block_q), 2), one per
// chunk of a q-block of dq_accum (the column halves of the sm90 kernel's staged dQ; at head dim 64 only the first
// is used): the preprocess zeroes these instead of dq_accum, the sm90 kernel's first addition into a chunk is a
// store (bwd_sm90.cuh write_dq) and its postprocess reads a chunk nobody wrote as zeros. Families and modes that
// do not use it (sm80, deterministic mode, an sm90 kernel built without first stores) launch as if it were null.
// tile_order: null, or int32 (B * Hkv * ceil(Lk / block_k)) that the preprocess fills with the sm90 kernel's work
// tiles, longest walks first within each section (bwd_sm90.cuh OrderSection), and that kernel takes them in; the
// sm80 kernel, deterministic mode and an sm90 kernel built without it take them in their plain order instead.
struct AttngenBwdArgs {
  const void* q;         // (B, Hq, Lq, D), last dim contiguous
  const void* k;         // (B, Hkv, Lk, D)
  const void* v;         // (B, Hkv, Lk, D)
  const void* o;         // (B, Hq, Lq, D): the forward's output
  const void* dout;      // (B, Hq, Lq, D)
  const float* lse;      // (B, Hq, Lq) contiguous, natural log, -inf for rows with nothing kept
  void* dq;              // (B, Hq, Lq, D)
  void* dk;              // (B, Hkv, Lk, D)
  void* dv;              // (B, Hkv, Lk, D)
  float* dq_accum;
  float* delta;          // rowsum(dout * o), written by the preprocess kernel
  float* lse_log2;       // lse * log2(e), +inf for -inf rows and padding (P = 2^(x - lse_log2) = 0 there)
  long long q_stride[3];
  long long k_stride[3];
  long long v_stride[3];
  long long o_stride[3];
  long long do_stride[3];
  long long dq_stride[3];
  long long dk_stride[3];
  long long dv_stride[3];
  int B, Hq, Hkv, Lq, Lk, D;
  float scale;
  int q_offset;
  CapturedArgs captured;
  float* dcaptured[ATTNGEN_MAX_CAPTURED];
  int* dq_semaphore;
  int* tile_counter;
  int* dq_written;
  int* tile_order;
};

#if defined(__cplusplus) && !defined(__CUDACC_RTC__)
static_assert(sizeof(AttngenBwdArgs) == 928, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, dq_accum) == 72, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, B) == 288, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, scale) == 312, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, captured) == 320, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, dcaptured) == 832, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, dq_semaphore) == 896, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, tile_counter) == 904, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, dq_written) == 912, "AttngenBwdArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenBwdArgs, tile_order) == 920, "AttngenBwdArgs layout is part of the C ABI");
#endif
