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
// fp32 and a combine kernel merges them by LSE. decode_layout.cuh holds the static facts, decode_walk.cuh the cache
// reads and the walk, decode_combine.cuh the combine.
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
#include "decode_layout.cuh"
#include "decode_walk.cuh"

#ifndef ATTNGEN_TILES_READ_HEAD
#define ATTNGEN_TILES_READ_HEAD 1  // unknown: one head per CTA
#endif

namespace {

using namespace attngen;

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

}  // namespace

#include "decode_combine.cuh"

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
