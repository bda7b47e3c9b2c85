// decode_walk.cuh: what a KV-cache CTA (fwd_decode.cuh) reads: its sequence (lengths, where its cache rows live:
// a contiguous cache, cache_batch_idx, or a page table), the K/V ring's swizzled rows and the loader that fills them
// with cp.async (one address per tile where a tile is one run of cache rows, row by row otherwise), and the kv tiles
// it walks (the derived range, or every tile when the predicates read block summaries). Include after
// decode_layout.cuh and variant.inc's block predicates (block_range.cuh).
#pragma once

#include "attngen_common.cuh"
#include "attngen_decode_abi.cuh"
#include "sm80_tiles.cuh"
#include "block_range.cuh"
#include "decode_layout.cuh"

#ifndef ATTNGEN_NUM_SUMMARIES
#define ATTNGEN_NUM_SUMMARIES 0  // hand-written variant.inc files (tests/data) that predate the decode kernel
#endif

namespace {

using namespace attngen;

// One CTA's sequence: its lengths and where its cache rows live.
struct Sequence {
  int qoff, kvlen;           // q_idx = qoff + row; keys 0 .. kvlen - 1
  long long k_base, v_base;  // element offsets of (cache row or page 0, kv head, position 0)
  const int* pages;          // this sequence's page-table row, NULL for a contiguous cache
};

ATTNGEN_DEV_INLINE Sequence sequence_of(const AttngenDecodeArgs& a, int b, int kvh) {
  Sequence s;
  const int cached = a.seqlens != nullptr ? __ldg(a.seqlens + b) : a.seqlen_default;
  s.qoff = max(cached, 0);
  s.kvlen = min(s.qoff + a.kv_extra, a.capacity);
  int row = 0;
  if (a.page_table == nullptr) {
    row = a.cache_batch_idx != nullptr ? __ldg(a.cache_batch_idx + b) : b;
    row = min(max(row, 0), a.cache_rows - 1);
  }
  s.k_base = (long long)row * a.k_stride[0] + (long long)kvh * a.k_stride[1];
  s.v_base = (long long)row * a.v_stride[0] + (long long)kvh * a.v_stride[1];
  s.pages = a.page_table != nullptr ? a.page_table + (long long)b * a.page_table_stride : nullptr;
  return s;
}

// The K/V loader: each warp copies the WK rows it reads itself, so a tile needs a barrier of the warp only (copying
// the tile with the whole CTA measured the same). A thread copies one 16-byte column chunk of LOAD_PASSES rows, ROW_STEP
// rows apart from its first row.
constexpr int ROW_STEP = 32 / CHUNKS_PER_ROW;  // rows per warp instruction
constexpr int LOAD_PASSES = WK / ROW_STEP;
static_assert(32 % CHUNKS_PER_ROW == 0 && WK % ROW_STEP == 0,
              "whole rows per warp instruction, whole passes over a warp's rows");

// Byte offset of chunk `chunk` of row r in a ring slot (the swizzle above).
ATTNGEN_DEV_INLINE uint32_t kv_slot_offset(int r, int chunk) {
  return (uint32_t)(r * KV_ROW_BYTES + ((chunk ^ (r & 7)) << 4));
}

// A lane's ldmatrix offsets in a ring slot: its row's start, and for chunk pairs 2k (k = 0..3 within a 128-byte
// line) the swizzled offset of its chunk 2k + c (c: which chunk of the pair the lane addresses), so the column
// step 2k of an unrolled loop is the line (k / 4) * 128 plus xo[k % 4].
struct SwizzledLane {
  uint32_t row;
  uint32_t xo[4];
  ATTNGEN_DEV_INLINE SwizzledLane(int r, int c) {
    row = (uint32_t)(r * KV_ROW_BYTES);
#pragma unroll
    for (int k = 0; k < 4; ++k) xo[k] = (uint32_t)(((2 * k) ^ c ^ (r & 7)) << 4);
  }
  ATTNGEN_DEV_INLINE uint32_t at(int pair) const { return row + (uint32_t)((pair / 4) * 128) + xo[pair % 4]; }
};

// One thread's share of every tile, fixed for the CTA.
struct KvLoader {
  int r0;                       // its first row of a tile
  int chunk;                    // its 16-byte chunk of a row (elements 8 chunk ..)
  long long k_off, v_off;       // the same chunk in the cache, from the tile's first row (elements)
  long long k_step, v_step;     // ROW_STEP rows of the cache (elements)
  bool runs;                    // every tile is one run of rows: a contiguous cache, or pages holding whole tiles
};

ATTNGEN_DEV_INLINE KvLoader kv_loader(const AttngenDecodeArgs& a, int tid) {
  KvLoader L;
  const int chunk = tid % CHUNKS_PER_ROW;
  L.r0 = (tid >> 5) * WK + (tid & 31) / CHUNKS_PER_ROW;
  L.chunk = chunk;
  L.k_off = (long long)L.r0 * a.k_stride[2] + chunk * 8;
  L.v_off = (long long)L.r0 * a.v_stride[2] + chunk * 8;
  L.k_step = (long long)ROW_STEP * a.k_stride[2];
  L.v_step = (long long)ROW_STEP * a.v_stride[2];
  L.runs = a.page_table == nullptr || a.page_size % BK == 0;
  return L;
}

// Copy cache positions [p0, p0 + BK) of K and V into one ring slot (rows past kvlen zero-filled). A tile that is
// one run of cache rows takes one address per tile (one page lookup when paged) and, when whole, no row checks;
// otherwise each row is located on its own (its page looked up once for K and V).
ATTNGEN_DEV_INLINE void load_kv_tile(uint32_t sK, uint32_t sV, const Elem* kc, const Elem* vc, const Sequence& s,
                                     const AttngenDecodeArgs& a, const KvLoader& L, int p0) {
  if (L.runs) {
    long long kt = s.k_base, vt = s.v_base;  // the tile's first row
    if (s.pages != nullptr) {
      const long long page = min(max(__ldg(s.pages + p0 / a.page_size), 0), a.num_pages - 1);
      const long long slot = p0 % a.page_size;
      kt += page * a.k_stride[0] + slot * a.k_stride[2];
      vt += page * a.v_stride[0] + slot * a.v_stride[2];
    } else {
      kt += (long long)p0 * a.k_stride[2];
      vt += (long long)p0 * a.v_stride[2];
    }
    const Elem* kp = kc + kt + L.k_off;
    const Elem* vp = vc + vt + L.v_off;
    if (p0 + BK <= s.kvlen) {
#pragma unroll
      for (int n = 0; n < LOAD_PASSES; ++n) {
        const uint32_t dst = kv_slot_offset(L.r0 + n * ROW_STEP, L.chunk);
        cp_async_16(sK + dst, kp + n * L.k_step, true);
        cp_async_16(sV + dst, vp + n * L.v_step, true);
      }
    } else {
#pragma unroll
      for (int n = 0; n < LOAD_PASSES; ++n) {
        const bool valid = p0 + L.r0 + n * ROW_STEP < s.kvlen;
        const uint32_t dst = kv_slot_offset(L.r0 + n * ROW_STEP, L.chunk);
        cp_async_16(sK + dst, kp + n * L.k_step, valid);
        cp_async_16(sV + dst, vp + n * L.v_step, valid);
      }
    }
    return;
  }
#pragma unroll
  for (int n = 0; n < LOAD_PASSES; ++n) {
    const int p = p0 + L.r0 + n * ROW_STEP;
    const bool valid = p < s.kvlen;
    long long ko = s.k_base, vo = s.v_base;
    if (valid) {
      const long long page = min(max(__ldg(s.pages + p / a.page_size), 0), a.num_pages - 1);
      const long long slot = p % a.page_size;
      ko += page * a.k_stride[0] + slot * a.k_stride[2];
      vo += page * a.v_stride[0] + slot * a.v_stride[2];
    }
    const uint32_t dst = kv_slot_offset(L.r0 + n * ROW_STEP, L.chunk);
    cp_async_16(sK + dst, kc + ko + L.chunk * 8, valid);
    cp_async_16(sV + dst, vc + vo + L.chunk * 8, valid);
  }
}

// The kv tiles a CTA walks: the derived range (block_range.cuh) of the 16-row q-block holding its positions, or
// every tile when the variant's predicates read block summaries (computed per call for one q offset, which the
// sequences here do not share).
ATTNGEN_DEV_INLINE KvRange decode_range(const CapturedArgs& C, const TileArgs& t, int i) {
#if ATTNGEN_NUM_SUMMARIES
  KvRange r = {};
  r.j_begin = 0;
  r.j_end = (t.KVLEN + BK - 1) / BK;
  r.f_lo = r.f_hi = 0;  // nothing known FULL: the mask is evaluated on every tile
  return r;
#else
  return kv_range<BQ, BK>(C, t, i);
#endif
}

ATTNGEN_DEV_INLINE int decode_next(const CapturedArgs& C, const TileArgs& t, int i, int j, int j_end,
                                   const KvRange& r) {
#if ATTNGEN_NUM_SUMMARIES
  return j;
#else
  return next_kv_tile<BQ, BK>(C, t, i, j, j_end, r.f_lo, r.f_hi, r);
#endif
}

// Whether tile j needs mask_mod: off the FULL range, unless the classifier proves it FULL (never with summaries).
ATTNGEN_DEV_INLINE bool tile_masked(const CapturedArgs& C, const TileArgs& t, int i, int j, const KvRange& r) {
#if ATTNGEN_HAS_MASK
  bool masked = !(j >= r.f_lo && j < r.f_hi);
#if ATTNGEN_NEEDS_CLASSIFIER && !ATTNGEN_NUM_SUMMARIES
  if (masked) masked = !tile_all<BQ, BK>(C, t, i, j);
#endif
  return masked;
#else
  return false;
#endif
}

}  // namespace
