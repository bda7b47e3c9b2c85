// fwd_decode.cuh: attention against a KV cache for a few query rows (decode, speculative steps), Flash-Decoding
// style: one CTA per (kv split, q chunk x head group, batch). PackGQA: the CTA's 16 query rows are heads_per_cta
// query heads of one kv head times 16 / heads_per_cta query positions (row r: head h0 + r % heads_per_cta,
// position r / heads_per_cta of the chunk), so each K/V tile is read once for all of them; the NWARPS warps split
// every tile's BK cache positions (BK / NWARPS each) and keep their own softmax state, merged through shared
// memory at the end. K/V tiles stream through a STAGES-deep cp.async ring of swizzled rows, one address per tile
// where a tile is one run of cache rows (contiguous cache, cache_batch_idx, pages holding whole tiles), row by row
// otherwise (a page table with any page size). S = Q K^T and O += P V on mma.sync m16n8k16, the
// variant's score_mod / mask_mod and block skipping as in the forward kernels, with per-sequence lengths. A CTA
// walks its split's share of the derived kv range; with several splits each writes its normalised O and LSE in
// fp32 and a combine kernel merges them by LSE.
// Configuration (Elem, D, BQ, BK, NWARPS, STAGES, MIN_BLOCKS, kDtypeCode, kArch) and variant.inc come from the
// including attngen_fwd.cu (templates/attngen_fwd.cu.j2).
#pragma once

#include "attngen_common.cuh"
#include "attngen_decode_abi.cuh"
#include "sm80_tiles.cuh"
#include "block_range.cuh"
#include "score_mask.cuh"
#include "softmax.cuh"
#include "epilogue.cuh"
#include "host_abi_common.cuh"
#include "pdl.cuh"

#ifndef ATTNGEN_NUM_SUMMARIES
#define ATTNGEN_NUM_SUMMARIES 0  // hand-written variant.inc files (tests/data) that predate the decode kernel
#endif
#ifndef ATTNGEN_TILES_READ_HEAD
#define ATTNGEN_TILES_READ_HEAD 1  // unknown: one head per CTA
#endif

namespace {

using namespace attngen;
// griddepcontrol exists from sm_90 on: a library built for an older arch launches plainly wherever it runs.
constexpr bool DECODE_PDL = PDL && kArch >= 90;

constexpr int NTHREADS = NWARPS * 32;
constexpr int WK = BK / NWARPS;   // cache positions per warp per tile
constexpr int NT_S = WK / 8;      // n8 tiles of a warp's S
constexpr int NT_O = D / 8;       // n8 tiles of O
constexpr int KC_QK = D / 16;     // k16 steps of Q K^T
constexpr int KC_PV = WK / 16;    // k16 steps of P V
constexpr int MAX_HEADS = 16;     // heads_per_cta: a power of two up to the 16 rows
constexpr bool Q_IN_REGS = D <= 128;  // at head dim 256 the fragments would push O into spills

using Rows = PaddedRows<Elem, D, NTHREADS>;
constexpr int LDS = Rows::LDS;
constexpr int ROW_BYTES = Rows::ROW_BYTES;
constexpr int CHUNKS_PER_ROW = Rows::CHUNKS_PER_ROW;
constexpr int ROWS_PER_PASS = Rows::ROWS_PER_PASS;
constexpr int Q_TILE = BQ * LDS;  // elements
// K/V ring rows are unpadded, their 16-byte chunks XOR-swizzled by the row's low 3 bits (chunk c of row r at
// c ^ (r & 7)): a warp's cp.async then writes whole 128-byte lines of shared memory, which keeps its global reads
// at the ideal sector count (padded rows split them: 24 sectors per 512 bytes), and ldmatrix's 8 rows of a chunk
// fall in 8 bank groups.
constexpr int KV_ROW_BYTES = D * 2;
constexpr int KV_TILE = BK * D;  // elements
constexpr int SMEM_BYTES = (Q_TILE + 2 * STAGES * KV_TILE) * 2;
// The warps' softmax states, merged at the end in the (then idle) K/V ring: O rows in fp32, then m and l.
constexpr int MERGE_BYTES = NWARPS * BQ * (D + 2) * 4;

static_assert(BQ == 16, "one m16 tile of packed query rows");
static_assert(WK % 16 == 0 && BK % ROWS_PER_PASS == 0, "BK: whole k16 steps per warp and whole loader passes");
static_assert(STAGES >= 2, "a ring of at least two K/V tiles");
static_assert(CHUNKS_PER_ROW % 8 == 0, "the K/V swizzle permutes chunks within 128-byte lines");
static_assert(MERGE_BYTES <= 2 * STAGES * KV_TILE * 2, "the merge buffers fit in the K/V ring");
static_assert((BQ * CHUNKS_PER_ROW) % NTHREADS == 0 && (BQ * D) % NTHREADS == 0, "whole passes over Q and O");
static_assert(attngen_head_dim_supported(D), "head dim: one of ATTNGEN_HEAD_DIMS");

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

// A warp's S fragment (unscaled Q K^T of its packed rows g and g + 8 at cache positions kv0 + 8 nt + 2 tig + e) ->
// log2-domain scores, each row with its own head (score_tile's element rule, score_mask.cuh, with per-row heads).
template <bool MASK, bool BOUNDS>
ATTNGEN_DEV_INLINE void score_packed(float (&s)[1][NT_S][4], float scale, const CapturedArgs& C,
                                     const HeadCtx (&hc)[2], const RowCtx (&rc)[1][2], const int (&qi)[1][2],
                                     int kv0, int KVLEN, int tig) {
#if !ATTNGEN_HAS_SCORE_MOD
  const float scale_log2 = scale * LOG2E;
#endif
#pragma unroll
  for (int nt = 0; nt < NT_S; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = kv0 + nt * 8 + tig * 2 + e;
      const bool col_ok = !BOUNDS || col < KVLEN;
      const int kv = BOUNDS ? min(col, KVLEN - 1) : col;
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
#if ATTNGEN_HAS_SCORE_MOD || ATTNGEN_HAS_MASK
        const ColCtx cc = col_ctx(C, hc[rh], kv);
#endif
        float& x = s[0][nt][rh * 2 + e];
#if ATTNGEN_HAS_SCORE_MOD && ATTNGEN_SCORE_HEAD_SCALE
        const float y = x * (scale * score_head_scale(C, hc[rh]) * LOG2E);
#elif ATTNGEN_HAS_SCORE_MOD
        const float y = score_mod(x * scale, C, hc[rh], rc[0][rh], cc, qi[0][rh], kv) * LOG2E;
#else
        const float y = x * scale_log2;
#endif
        bool keep = col_ok;
#if ATTNGEN_HAS_MASK
        if (MASK) keep = keep & mask_mod(C, hc[rh], rc[0][rh], cc, qi[0][rh], kv);
#endif
        x = keep ? y : -INFINITY;
      }
    }
  }
}

__global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS) attngen_decode_kernel(const __grid_constant__ AttngenDecodeArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = smem_addr(smem_raw);
  const uint32_t sK = sQ + Q_TILE * 2;             // [STAGES][BK][D], swizzled
  const uint32_t sV = sK + STAGES * KV_TILE * 2;   // [STAGES][BK][D], swizzled

  pdl_launch_dependents<DECODE_PDL>();
  pdl_wait<DECODE_PDL>();  // PDL: launched while the kernel ahead (an append's positions, a previous call) drains
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;

  const int hp = a.heads_per_cta;  // packed heads; BQ / hp positions each
  const int nq = BQ / hp;
  const int groups = a.Hq / hp;
  const int split = blockIdx.x;
  const int hgroup = (int)blockIdx.y % groups;
  const int chunk_q = (int)blockIdx.y / groups;  // positions [chunk_q nq, chunk_q nq + nq)
  const int b = blockIdx.z;
  const int h0 = hgroup * hp;
  const int kvh = h0 / (a.Hq / a.Hkv);
  const int i = chunk_q * nq / BQ;  // the 16-row q-block holding them (nq divides BQ)

  const Sequence sq = sequence_of(a, b, kvh);
  const CapturedArgs& C = a.captured;
  TileArgs t;
  t.QLEN = a.Lq;
  t.KVLEN = sq.kvlen;
  t.QOFF = sq.qoff;
  t.b = b;
  t.h = h0;  // the walk and the tile classes: head-independent unless hp == 1 (ATTNGEN_TILES_READ_HEAD)

  // This split's share of the walk.
  const KvRange range = decode_range(C, t, i);
  const int span = max(range.j_end - range.j_begin, 0);
  const int per_split = (span + a.num_splits - 1) / a.num_splits;
  const int j_lo = range.j_begin + split * per_split;
  const int j_end = min(range.j_end, j_lo + per_split);

  // Q, packed: row r is head h0 + r % hp at position chunk_q nq + r / hp (zero past Lq).
  {
    const Elem* q = static_cast<const Elem*>(a.q);
    const int chunk = tid % CHUNKS_PER_ROW;
#pragma unroll
    for (int n = 0; n < BQ * CHUNKS_PER_ROW / NTHREADS; ++n) {
      const int r = tid / CHUNKS_PER_ROW + n * ROWS_PER_PASS;
      const int row = chunk_q * nq + r / hp;
      const bool valid = row < a.Lq;
      const long long off = valid ? (long long)b * a.q_stride[0] + (long long)(h0 + r % hp) * a.q_stride[1] +
                                        (long long)row * a.q_stride[2] : 0;
      cp_async_16(sQ + (uint32_t)(r * ROW_BYTES + chunk * 16), q + off + chunk * 8, valid);
    }
  }
  const KvLoader loader = kv_loader(a, tid);
  const Elem* kc = static_cast<const Elem*>(a.k_cache);
  const Elem* vc = static_cast<const Elem*>(a.v_cache);
  // Prologue: Q with the first tile, then STAGES - 2 more tiles, one cp.async group each.
  int jq[STAGES - 1];  // the tiles in flight, oldest first (j_end: none)
  int jl = decode_next(C, t, i, j_lo, j_end, range);  // the next tile to load
#pragma unroll
  for (int n = 0; n < STAGES - 1; ++n) {
    jq[n] = jl;
    if (jl < j_end) {
      load_kv_tile(sK + n * KV_TILE * 2, sV + n * KV_TILE * 2, kc, vc, sq, a, loader, jl * BK);
      jl = decode_next(C, t, i, jl + 1, j_end, range);
    }
    cp_async_commit();
  }

  // Per-row state: a thread holds packed rows g and g + 8.
  HeadCtx hc[2];
  int qi[1][2];
  RowCtx rc[1][2];
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int r = rh * 8 + g;
    hc[rh] = head_ctx(C, b, h0 + r % hp);
    // positions past Lq: computed with the last one's index, never stored
    qi[0][rh] = min(chunk_q * nq + r / hp, a.Lq - 1) + sq.qoff;
    rc[0][rh] = row_ctx(C, hc[rh], qi[0][rh]);
  }
  float o[1][NT_O][4];
  float m[1][2] = {{-INFINITY, -INFINITY}};
  float l[1][2] = {{0.f, 0.f}};
  zero(o);

  const uint32_t q_lane = lane_a<ROW_BYTES>(lane, 0);
  // lane_b / lane_b_trans (sm80_tiles.cuh) on the swizzled rows of this warp's WK positions (WK % 8 == 0 keeps
  // the swizzle of a row's low bits)
  const SwizzledLane k_lane(warp * WK + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  const SwizzledLane v_lane(warp * WK + (lane & 15), lane >> 4);
  uint32_t qa[Q_IN_REGS ? KC_QK : 1][4];  // Q fragments kept for the whole walk (head dims up to 128)
  bool q_ready = !Q_IN_REGS;
  bool first = true;  // every warp walks the same tiles: the CTA-wide barrier of the first one is uniform

  int stage = 0;
  while (jq[0] < j_end) {
    cp_async_wait<STAGES - 2>();
    // tile jq[0] visible to the warp that reads its rows, which is done with the slot loaded next: its own rows
    // (the CTA waits once, for Q)
    if (first) __syncthreads();
    else __syncwarp();
    first = false;
    const int slot = (stage + STAGES - 1) % STAGES;
    const int j_new = jl;
    if (jl < j_end) {
      load_kv_tile(sK + slot * KV_TILE * 2, sV + slot * KV_TILE * 2, kc, vc, sq, a, loader, jl * BK);
      jl = decode_next(C, t, i, jl + 1, j_end, range);
    }
    cp_async_commit();

    if (!q_ready) {
#pragma unroll
      for (int kc16 = 0; kc16 < KC_QK; ++kc16) ldmatrix_x4(qa[Q_IN_REGS ? kc16 : 0], sQ + q_lane + kc16 * 32);
      q_ready = true;
    }
    const int j = jq[0];
    const uint32_t sKs = sK + (uint32_t)(stage * KV_TILE * 2);
    const uint32_t sVs = sV + (uint32_t)(stage * KV_TILE * 2);
    float s[1][NT_S][4];
    zero(s);
#pragma unroll
    for (int kc16 = 0; kc16 < KC_QK; ++kc16) {
      uint32_t qf[4];
      if constexpr (Q_IN_REGS) {
#pragma unroll
        for (int e = 0; e < 4; ++e) qf[e] = qa[kc16][e];
      } else {
        ldmatrix_x4(qf, sQ + q_lane + kc16 * 32);
      }
#pragma unroll
      for (int np = 0; np < NT_S / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, sKs + k_lane.at(kc16) + (uint32_t)(np * 16 * KV_ROW_BYTES));
        mma_16816<Elem>(s[0][2 * np], qf, kb[0], kb[1]);
        mma_16816<Elem>(s[0][2 * np + 1], qf, kb[2], kb[3]);
      }
    }
    const int kv0 = j * BK + warp * WK;
    const bool bounds = kv0 + WK > sq.kvlen;
    if (tile_masked(C, t, i, j, range)) {
      if (bounds) score_packed<true, true>(s, a.scale, C, hc, rc, qi, kv0, sq.kvlen, tig);
      else score_packed<true, false>(s, a.scale, C, hc, rc, qi, kv0, sq.kvlen, tig);
    } else {
      if (bounds) score_packed<false, true>(s, a.scale, C, hc, rc, qi, kv0, sq.kvlen, tig);
      else score_packed<false, false>(s, a.scale, C, hc, rc, qi, kv0, sq.kvlen, tig);
    }
    online_softmax_rescale(s, m, l, o);
#pragma unroll
    for (int kc16 = 0; kc16 < KC_PV; ++kc16) {
      uint32_t pa[4];
      acc_to_a<Elem>(pa, s[0], kc16);
#pragma unroll
      for (int dp = 0; dp < NT_O / 2; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sVs + v_lane.at(dp) + (uint32_t)(kc16 * 16 * KV_ROW_BYTES));
        mma_16816<Elem>(o[0][2 * dp], pa, vb[0], vb[1]);
        mma_16816<Elem>(o[0][2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
#pragma unroll
    for (int n = 0; n + 1 < STAGES - 1; ++n) jq[n] = jq[n + 1];
    jq[STAGES - 2] = j_new;
    stage = (stage + 1) % STAGES;
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: every warp's state goes there

  // Merge the warps' states: O (unnormalised) and per-row m (log2 domain), l.
  float* sO = reinterpret_cast<float*>(smem_raw + Q_TILE * 2);  // [NWARPS][BQ][D]
  float* sM = sO + NWARPS * BQ * D;                                // [NWARPS][BQ]
  float* sL = sM + NWARPS * BQ;                                    // [NWARPS][BQ]
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int r = rh * 8 + g;
    float* orow = sO + (warp * BQ + r) * D;
#pragma unroll
    for (int nt = 0; nt < NT_O; ++nt)
      *reinterpret_cast<float2*>(orow + nt * 8 + tig * 2) = make_float2(o[0][nt][rh * 2], o[0][nt][rh * 2 + 1]);
    const float sum = quad_sum(l[0][rh]);
    if (tig == 0) {
      sM[warp * BQ + r] = m[0][rh];
      sL[warp * BQ + r] = sum;
    }
  }
  __syncthreads();

  // Each thread: one packed row, D / (NTHREADS / BQ) columns of it.
  constexpr int THREADS_PER_ROW = NTHREADS / BQ;
  constexpr int COLS = D / THREADS_PER_ROW;
  const int r = tid / THREADS_PER_ROW;
  const int c0 = (tid % THREADS_PER_ROW) * COLS;
  const int row = chunk_q * nq + r / hp;
  if (row >= a.Lq) return;
  const int h = h0 + r % hp;
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, sM[w * BQ + r]);
  const float m_sub = mx == -INFINITY ? 0.f : mx;
  float f[NWARPS], sum = 0.f;
#pragma unroll
  for (int w = 0; w < NWARPS; ++w) {
    f[w] = fast_exp2(sM[w * BQ + r] - m_sub);
    sum = fmaf(sL[w * BQ + r], f[w], sum);
  }
  const float inv = inv_or_zero(sum);
  const float lse = row_lse(mx, 1.f, sum);
  const long long lrow = ((long long)b * a.Hq + h) * a.Lq + row;
  const long long rows = (long long)a.B * a.Hq * a.Lq;
  float* part = a.num_splits > 1 ? a.o_partial + ((long long)split * rows + lrow) * D + c0 : nullptr;
  Elem* out = static_cast<Elem*>(a.o) + (long long)b * a.o_stride[0] + (long long)h * a.o_stride[1] +
              (long long)row * a.o_stride[2] + c0;
#pragma unroll
  for (int c = 0; c < COLS; c += 2) {
    float x0 = 0.f, x1 = 0.f;
#pragma unroll
    for (int w = 0; w < NWARPS; ++w) {
      const float2 v = *reinterpret_cast<const float2*>(sO + (w * BQ + r) * D + c0 + c);
      x0 = fmaf(v.x, f[w], x0);
      x1 = fmaf(v.y, f[w], x1);
    }
    if (part != nullptr) *reinterpret_cast<float2*>(part + c) = make_float2(x0 * inv, x1 * inv);
    else *reinterpret_cast<uint32_t*>(out + c) = pack2<Elem>(x0 * inv, x1 * inv);
  }
  if (c0 == 0) {
    if (part != nullptr) a.lse_partial[(long long)split * rows + lrow] = lse;
    else if (a.lse != nullptr) a.lse[lrow] = lse;
  }
}

// The splits of each output row merged by LSE: one CTA per (b, h, row). Warp w takes splits w, w + COMBINE_WARPS,
// ..., COMBINE_PREFETCH of them per round with all their loads issued together (lanes over the head dim), merged
// online (running max, as the attention kernel's softmax); the warps' states meet in shared memory. Up to
// COMBINE_WARPS * COMBINE_PREFETCH splits cost one round trip to memory. A row that no split kept anything of gets
// O = 0 and LSE = -inf, as the one-split kernel writes.
constexpr int COMBINE_WARPS = 8;
constexpr int COMBINE_COLS = D / 32;  // columns per lane
constexpr int COMBINE_PREFETCH = D <= 128 ? 8 : 4;
static_assert(COMBINE_COLS % 2 == 0, "float2 reads of the partials");

__global__ void __launch_bounds__(COMBINE_WARPS * 32) attngen_decode_combine(const __grid_constant__ AttngenDecodeArgs a) {
  __shared__ float acc_w[COMBINE_WARPS][D];
  __shared__ float m_w[COMBINE_WARPS], sum_w[COMBINE_WARPS];
  const long long rows = (long long)a.B * a.Hq * a.Lq;
  const long long lrow = blockIdx.x;
  pdl_wait<DECODE_PDL>();  // every split's partial O and LSE (PDL: launched while the decode kernel drains)
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const float* lse_p = a.lse_partial + lrow;                          // split s at lse_p[s * rows]
  const float* o_p = a.o_partial + lrow * D + lane * COMBINE_COLS;     // split s at o_p[s * rows * D]
  float m = -INFINITY, sum = 0.f;
  float acc[COMBINE_COLS] = {};
  for (int s0 = warp; s0 < a.num_splits; s0 += COMBINE_WARPS * COMBINE_PREFETCH) {
    float ls[COMBINE_PREFETCH];
    float2 ov[COMBINE_PREFETCH][COMBINE_COLS / 2];
#pragma unroll
    for (int k = 0; k < COMBINE_PREFETCH; ++k) {
      const int s = s0 + k * COMBINE_WARPS;
      const bool in = s < a.num_splits;
      ls[k] = in ? lse_p[s * rows] : -INFINITY;
#pragma unroll
      for (int e = 0; e < COMBINE_COLS / 2; ++e)
        ov[k][e] = in ? reinterpret_cast<const float2*>(o_p + s * rows * D)[e] : make_float2(0.f, 0.f);
    }
    float m_new = m;
#pragma unroll
    for (int k = 0; k < COMBINE_PREFETCH; ++k) m_new = fmaxf(m_new, ls[k]);
    const float base = m_new == -INFINITY ? 0.f : m_new;  // nothing kept yet: every weight is 0
    const float f = expf(m - base);
    sum *= f;
#pragma unroll
    for (int c = 0; c < COMBINE_COLS; ++c) acc[c] *= f;
#pragma unroll
    for (int k = 0; k < COMBINE_PREFETCH; ++k) {
      const float w = expf(ls[k] - base);
      sum += w;
#pragma unroll
      for (int e = 0; e < COMBINE_COLS / 2; ++e) {
        acc[2 * e] = fmaf(w, ov[k][e].x, acc[2 * e]);
        acc[2 * e + 1] = fmaf(w, ov[k][e].y, acc[2 * e + 1]);
      }
    }
    m = m_new;
  }
#pragma unroll
  for (int c = 0; c < COMBINE_COLS; ++c) acc_w[warp][lane * COMBINE_COLS + c] = acc[c];
  if (lane == 0) {
    m_w[warp] = m;
    sum_w[warp] = sum;
  }
  __syncthreads();
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < COMBINE_WARPS; ++w) mx = fmaxf(mx, m_w[w]);
  const float base = mx == -INFINITY ? 0.f : mx;
  float fw[COMBINE_WARPS], total = 0.f;
#pragma unroll
  for (int w = 0; w < COMBINE_WARPS; ++w) {
    fw[w] = expf(m_w[w] - base);
    total = fmaf(sum_w[w], fw[w], total);
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const int h = (int)((lrow / a.Lq) % a.Hq);
  const int b = (int)(lrow / ((long long)a.Lq * a.Hq));
  const int row = (int)(lrow % a.Lq);
  Elem* orow = static_cast<Elem*>(a.o) + (long long)b * a.o_stride[0] + (long long)h * a.o_stride[1] +
               (long long)row * a.o_stride[2];
  for (int c = 2 * (int)threadIdx.x; c < D; c += 2 * COMBINE_WARPS * 32) {
    float x0 = 0.f, x1 = 0.f;
#pragma unroll
    for (int w = 0; w < COMBINE_WARPS; ++w) {
      x0 = fmaf(acc_w[w][c], fw[w], x0);
      x1 = fmaf(acc_w[w][c + 1], fw[w], x1);
    }
    *reinterpret_cast<uint32_t*>(orow + c) = pack2<Elem>(x0 * inv, x1 * inv);
  }
  if (a.lse != nullptr && threadIdx.x == 0) a.lse[lrow] = total > 0.f ? base + logf(total) : -INFINITY;
}

}  // namespace

// ------------------------------------------------------------------------------------- host side

extern "C" ATTNGEN_EXPORT int attngen_decode_kernel_info(AttngenKernelInfo* info) {
  if (info == nullptr) return (int)cudaErrorInvalidValue;
  *info = {ATTNGEN_DECODE_ABI_VERSION, (int)sizeof(AttngenDecodeArgs), D, kDtypeCode, BQ, BK, NTHREADS, SMEM_BYTES,
           kArch};
  return (int)cudaSuccess;
}

// Query heads of one kv head packed per CTA for a group of `group` heads (Hq / Hkv): the largest power of two up to
// MAX_HEADS dividing the group, or 1 when the variant's kv walk depends on the head.
extern "C" ATTNGEN_EXPORT int attngen_decode_heads_per_cta(int group) {
  if (ATTNGEN_TILES_READ_HEAD || group <= 0) return 1;
  int n = 1;
  while (n * 2 <= MAX_HEADS && group % (n * 2) == 0) n *= 2;
  return n;
}

extern "C" ATTNGEN_EXPORT int attngen_decode(const AttngenDecodeArgs* a, void* stream_ptr) {
  if (a == nullptr) return (int)cudaErrorInvalidValue;
  if (a->D != D || a->B < 0 || a->Hq < 0 || a->Lq < 0 || a->num_splits < 1 || a->Hkv <= 0 || a->Hq % a->Hkv != 0)
    return (int)cudaErrorInvalidValue;
  const int group = a->Hq / a->Hkv;  // heads_per_cta: a divisor of the group, at most what the variant allows
  if (a->heads_per_cta < 1 || group % a->heads_per_cta != 0 || BQ % a->heads_per_cta != 0 ||
      a->heads_per_cta > attngen_decode_heads_per_cta(group))
    return (int)cudaErrorInvalidValue;
  if (a->page_table != nullptr && (a->page_size < 1 || a->num_pages < 1 || a->cache_batch_idx != nullptr))
    return (int)cudaErrorInvalidValue;
  if (a->page_table == nullptr && a->cache_rows < 1) return (int)cudaErrorInvalidValue;
  if (a->capacity < 0 || a->kv_extra < 0) return (int)cudaErrorInvalidValue;
  if (a->num_splits > 1 && (a->o_partial == nullptr || a->lse_partial == nullptr)) return (int)cudaErrorInvalidValue;
  if (a->B == 0 || a->Hq == 0 || a->Lq == 0) return (int)cudaSuccess;
  const int nq = BQ / a->heads_per_cta;  // query positions per CTA
  const long long y = (long long)(a->Hq / a->heads_per_cta) * ((a->Lq + nq - 1) / nq);
  const long long rows = (long long)a->B * a->Hq * a->Lq;  // the combine's CTAs
  if (a->B > 65535 || y > 65535 || a->num_splits > 65535 || (a->num_splits > 1 && rows > 0x7fffffffLL))
    return (int)cudaErrorInvalidConfiguration;
  if (!is_aligned16(a->q) || !is_aligned16(a->k_cache) || !is_aligned16(a->v_cache) || !is_aligned16(a->o) ||
      !strides_ok(a->q_stride, a->B, a->Hq, a->Lq) || !strides_ok(a->k_stride, 2, a->Hkv, 2) ||
      !strides_ok(a->v_stride, 2, a->Hkv, 2) || !strides_ok(a->o_stride, a->B, a->Hq, a->Lq))
    return (int)cudaErrorMisalignedAddress;
  int dev = 0, sms = 0;
  cudaError_t err = prepare_device(attngen_decode_kernel, SMEM_BYTES, dev, sms);
  if (err != cudaSuccess) return (int)err;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const dim3 grid((unsigned)a->num_splits, (unsigned)y, (unsigned)a->B);
  err = launch_kernel(DECODE_PDL, attngen_decode_kernel, grid, dim3(NTHREADS), SMEM_BYTES, stream, *a);
  if (err != cudaSuccess || a->num_splits == 1) return (int)err;
  return (int)launch_kernel(DECODE_PDL, attngen_decode_combine, dim3((unsigned)rows), dim3(COMBINE_WARPS * 32), 0,
                            stream, *a);
}
