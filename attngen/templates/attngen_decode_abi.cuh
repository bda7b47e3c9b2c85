// attngen_decode_abi.cuh: the argument block of `attngen_decode` (the decode libraries' C ABI, fwd_decode.cuh).
// attngen/decode.py packs it byte for byte: field order, types and sizes change only together with
// ATTNGEN_DECODE_ABI_VERSION and decode.py.
#pragma once

#include "attngen_common.cuh"

#define ATTNGEN_DECODE_ABI_VERSION 2

// Sequence b attends with q_idx = s_b + row (row < Lq) to cache positions 0 .. s_b + kv_extra - 1, where s_b is
// seqlens[b] (seqlen_default when seqlens is NULL). Position p of sequence b lives in the contiguous cache at
// (cache row cache_batch_idx[b] (or b), kv head, p), or paged at (page_table[b * page_table_stride + p / page_size],
// kv head, p % page_size). With num_splits > 1 every split writes its O (normalised, fp32) and LSE into the
// partial workspaces and attngen_decode's combine kernel merges them into o / lse.
//
// Layout (x86-64 / aarch64, natural alignment, no padding):
//   offset   0  q, k_cache, v_cache, o, lse      5 pointers
//   offset  40  o_partial, lse_partial            2 pointers   fp32 workspaces (num_splits > 1), decode.py's
//   offset  56  seqlens, cache_batch_idx,         3 pointers   int32, each may be NULL
//               page_table
//   offset  80  q_stride[3] .. o_stride[3]        4 x 3 int64  element strides (batch / page, head, seq)
//   offset 176  page_table_stride                 int64
//   offset 184  B, Hq, Hkv, Lq, D                 5 int32
//   offset 204  seqlen_default, kv_extra,         5 int32
//               page_size, num_splits, heads_per_cta
//   offset 224  capacity, num_pages, cache_rows   3 int32      bounds the kernel clamps to
//   offset 236  scale (float32)
//   offset 240  captured                          CapturedArgs (512 bytes)
//   size   752
struct AttngenDecodeArgs {
  const void* q;              // (B, Hq, Lq, D), last dim contiguous
  const void* k_cache;        // (B_cache, Hkv, L_max, D) or (num_pages, Hkv, page_size, D)
  const void* v_cache;        // same layout as k_cache
  void* o;                    // (B, Hq, Lq, D), q's dtype
  float* lse;                 // (B, Hq, Lq) contiguous, natural log; NULL to skip
  float* o_partial;           // (num_splits, B, Hq, Lq, D) contiguous; unused when num_splits == 1
  float* lse_partial;         // (num_splits, B, Hq, Lq) contiguous
  const int* seqlens;         // (B,) cached length of each sequence before this call's queries, or NULL
  const int* cache_batch_idx; // (B,) cache row of each sequence, or NULL (row b); contiguous caches only
  const int* page_table;      // (B, max_pages), or NULL: a contiguous cache
  long long q_stride[3];
  long long k_stride[3];
  long long v_stride[3];
  long long o_stride[3];
  long long page_table_stride;
  int B, Hq, Hkv, Lq, D;
  int seqlen_default;         // s_b when seqlens is NULL
  int kv_extra;               // keys past s_b (the appended ones): a sequence has s_b + kv_extra keys
  int page_size;              // 1 .. 256 with a page table
  int num_splits;             // >= 1: CTAs sharing one kv range
  int heads_per_cta;          // query heads of one kv head walked together (a power of 2 up to 16 dividing Hq / Hkv)
  // What the cache holds. Values decode.py cannot check without a device sync (under CUDA-graph capture) are
  // clamped to these, so a bad length, page id or cache row reads the wrong keys, never outside the cache.
  int capacity;               // positions per sequence: L_max, or max_pages * page_size
  int num_pages;              // k_cache.shape[0] of a paged cache
  int cache_rows;             // k_cache.shape[0] of a contiguous cache
  float scale;
  CapturedArgs captured;
};

#if defined(__cplusplus) && !defined(__CUDACC_RTC__)
static_assert(sizeof(AttngenDecodeArgs) == 752, "AttngenDecodeArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenDecodeArgs, q_stride) == 80, "AttngenDecodeArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenDecodeArgs, B) == 184, "AttngenDecodeArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenDecodeArgs, scale) == 236, "AttngenDecodeArgs layout is part of the C ABI");
static_assert(__builtin_offsetof(AttngenDecodeArgs, captured) == 240, "AttngenDecodeArgs layout is part of the C ABI");
#endif
