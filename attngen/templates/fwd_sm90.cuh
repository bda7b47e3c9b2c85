// fwd_sm90.cuh: attention forward for sm_90a (Hopper), FlashAttention-3 style, warp specialized
// (docs/architecture.md). A work tile is one (q-block of BQ = 128 rows, query head, batch); which CTA
// runs which is sm90_scheduler.cuh's business. Warpgroup 0 is the producer: one thread loads each work
// tile's Q, then its K and V tiles into a STAGES-deep shared-memory ring, with TMA ("full" mbarriers
// complete on the copies' bytes, "empty" ones collect the consumers' releases), on few registers
// (setmaxnreg.dec). Warpgroups 1 and 2 are the consumers, 64 q rows each, with the registers the
// producer gave up: S = Q K^T with wgmma from shared memory (128-byte swizzled), scores and online
// softmax in registers, O += P V with wgmma (P from registers). OVERLAP: S(next) and P(this) V(this) are
// issued back to back and the softmax of S(next) runs under P V (FA3's intra-warpgroup overlap); without
// it one tile at a time, which leaves more registers to score_mod / mask_mod. PINGPONG: the two
// consumers issue their wgmmas in turns, so that one's softmax runs under the other's products.
// FP8 (Elem = fp8_e4m3, sm90_layout.cuh): the same pipeline on k32 wgmmas, V^T tiles (8-bit wgmma reads no
// transposed operand), P rounded to e4m3 for P V, the descale factors folded into the score scale and O's
// normalisation, bfloat16 output.
// Configuration (Elem, OutElem, D, BQ, BK, STAGES, PINGPONG, OVERLAP, PIN_SOFTMAX, PERSISTENT, PERSISTENT_MAX_KV,
// CROSS_TILE, RESCALE_THRESHOLD, kDtypeCode, kArch) and variant.inc come from the including attngen_fwd.cu
// (templates/attngen_fwd.cu.j2).
#pragma once

#include "attngen_common.cuh"
#include "sm80_mma.cuh"  // smem_addr, st_shared_b32, ld_shared_b32, pack2
#include "sm90_mbarrier.cuh"
#include "sm90_tma.cuh"  // also CUtensorMap (type only; nothing from libcuda is linked)
#include "sm90_wgmma.cuh"
#include "sm90_tile_counter.cuh"
#include "sm90_scheduler.cuh"
#include "pdl.cuh"
#include "sm90_layout.cuh"
#include "block_range.cuh"
#include "score_mask.cuh"
#include "softmax.cuh"
#include "epilogue.cuh"
#include "host_abi.cuh"

namespace {

using namespace attngen;

// Whether the work tiles go out in ascending q-block order: a union mask whose first q-block visits more kv
// tiles than its last (global query tokens: q < G keeps every key) would otherwise hand out its longest
// tiles last. Decided once per CTA on batch 0 / head 0's ranges, by thread 0 before the roles split, into shared
// memory (Smem::order), where each role reads it (ascending_order): the producer once per work tile, since a value
// kept through its loop (or the two estimates, which ptxas kept instead) spills from its 24 registers.
#if ATTNGEN_HAS_MASK && ATTNGEN_KV_PARTS
constexpr bool ORDER_AT_RUN_TIME = true;
__device__ __forceinline__ bool ascending_q_blocks(const AttngenFwdArgs& a) {
  TileArgs t;
  t.QLEN = a.Lq;
  t.KVLEN = a.Lk;
  t.QOFF = a.q_offset;
  t.b = 0;
  t.h = 0;
  const int last = (a.Lq + BQ - 1) / BQ - 1;
  return kv_tiles_estimate<BQ, BK>(a.captured, t, 0) > kv_tiles_estimate<BQ, BK>(a.captured, t, last);
}
#else
constexpr bool ORDER_AT_RUN_TIME = false;
__device__ __forceinline__ bool ascending_q_blocks(const AttngenFwdArgs&) { return false; }
#endif
__device__ __forceinline__ bool ascending_order(const Smem& sm) {
  if constexpr (!ORDER_AT_RUN_TIME) return false;
  return ld_shared_b32(sm.order()) != 0u;
}

// FP8: the position of kv column `col` of a 16-column group in V^T, where pack_a_frags (sm90_wgmma.cuh) puts its
// score in P's A fragment: column 8 a + 2 t + b goes to 4 t + 2 a + b. The host applies it (attngen/fp8.py,
// v_transposed) and tests/test_fp8.py checks the two against the fragment layouts.
ATTNGEN_HD constexpr int fp8_v_position(int col) { return 4 * ((col >> 1) & 3) + 2 * (col >> 3) + (col & 1); }

// FP8: the q and k descale factors of batch b, query head h's kv head fold into the score scale; v's scales O.
// Quantisation scales are positive, and without score_mod (or with a(d) s or a[h] s: score_mask.cuh) the row max is
// taken over raw q.k (a(d) q.k), which needs that: a factor <= 0 or NaN (the host reads no CUDA descale back) makes
// this head's output and LSE NaN, not quietly wrong.
__device__ __forceinline__ void fp8_descale(const AttngenFwdArgs& a, int b, int h, float& scale, float& o_scale) {
  const long long bh = (long long)a.B * a.Hkv, i = (long long)b * a.Hkv + h / (a.Hq / a.Hkv);
  const float qd = __ldg(a.descale + i), kd = __ldg(a.descale + bh + i), vd = __ldg(a.descale + 2 * bh + i);
  scale *= qd * kd;
  o_scale = vd;
  if (!(qd > 0.f && kd > 0.f && vd > 0.f && isfinite(qd) && isfinite(kd) && isfinite(vd)))
    scale = o_scale = __int_as_float(0x7fc00000);
}

// ------------------------------------------------------------------------------------------- producer
// One thread: for each work tile, Q once its buffer is free (one buffer: the consumers release it after
// their last Q K^T of the previous tile, so this load runs under that tile's last P V and epilogue; a
// persistent CTA's second buffer lets it run under the previous tile's last kv tiles), then K and V of
// every visited kv tile. K and V slots are
// released separately: a K slot is free half a tile before the P V that frees the V slot
// (docs/performance.md). Work tiles are decoded here and in each consumer after setmaxnreg.
__device__ __forceinline__ void produce(const AttngenFwdArgs& a, const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                        const CUtensorMap& tm_v, const Smem& sm, unsigned int* tile_counter,
                                        int heads_per_kv) {
  tma_prefetch_map(&tm_q);
  tma_prefetch_map(&tm_k);
  tma_prefetch_map(&tm_v);
  const CapturedArgs& C = a.captured;
  const int ntiles = num_tiles<BQ>(a);
  int stage = 0;
  uint32_t phase = 0;  // the ring carries on from work tile to work tile
  uint32_t n = 0;      // work tiles announced so far (the mailbox's and the Q buffers' phases)
  int w = (int)blockIdx.x;  // every CTA's first tile (a persistent grid has at most one CTA per tile)
  while (true) {
    if (PERSISTENT) sm.mailbox().announce(w, n & 1u);
    if (w < 0) break;
    int i;
    const TileArgs t = tile_args<BQ>(a, w, i, ascending_order(sm));
    const KvRange r = kv_range<BQ, BK>(C, t, i);
    const int qb = q_buffer(n);
    mbar_wait(sm.bar_q_empty(qb), q_parity(n) ^ 1u);
    mbar_arrive_expect_tx(sm.bar_q(qb), Q_BYTES);
#pragma unroll
    for (int db = 0; db < DB; ++db)
      tma_load_4d(sm.q(qb) + db * Q_BLOCK_BYTES, &tm_q, sm.bar_q(qb), db * ROW_ELEMS, i * BQ, t.h, t.b);
    ++n;
    const int kvh = t.h / heads_per_kv;  // GQA / MQA: consecutive query heads share a kv head
    for (int j = next_kv_tile<BQ, BK>(C, t, i, r.j_begin, r.j_end, r.f_lo, r.f_hi, r); j < r.j_end;
         j = next_kv_tile<BQ, BK>(C, t, i, j + 1, r.j_end, r.f_lo, r.f_hi, r)) {
      mbar_wait(sm.empty_k(stage), phase ^ 1u);
      const uint32_t k_dst = sm.k(stage), v_dst = sm.v(stage);
      mbar_arrive_expect_tx(sm.full_k(stage), KV_BYTES);
#pragma unroll
      for (int db = 0; db < DB; ++db)
        tma_load_4d(k_dst + db * KV_BLOCK_BYTES, &tm_k, sm.full_k(stage), db * ROW_ELEMS, j * BK, kvh, t.b);
      mbar_wait(sm.empty_v(stage), phase ^ 1u);
      mbar_arrive_expect_tx(sm.full_v(stage), KV_BYTES);
      if (FP8) {  // V^T: kv columns j BK .. j BK + BK - 1 of all D rows, VT_COLS at a time
#pragma unroll
        for (int vb = 0; vb < BK / VT_COLS; ++vb)
          tma_load_4d(v_dst + vb * VT_BLOCK_BYTES, &tm_v, sm.full_v(stage), j * BK + vb * VT_COLS, 0, kvh, t.b);
      } else {
#pragma unroll
        for (int db = 0; db < DB; ++db)
          tma_load_4d(v_dst + db * KV_BLOCK_BYTES, &tm_v, sm.full_v(stage), db * ROW_ELEMS, j * BK, kvh, t.b);
      }
      if (++stage == STAGES) {
        stage = 0;
        phase ^= 1u;
      }
    }
    w = next_work_tile<PERSISTENT>(tile_counter, sm.mailbox(), ntiles);
  }
  if (PERSISTENT && tile_counter != nullptr) counter_done(tile_counter);
}

// ------------------------------------------------------------------------------------------- consumers
// One consumer warpgroup's fixed view of the pipeline (Q descriptor: its 64 rows, K-major, SBO = 8 rows x
// 128 B; K: K-major; V: MN-major, LBO = distance between 64-column blocks, SBO = 8 kv rows; FP8's V^T: K-major,
// SBO = 8 d rows of VT_COLS bytes).
struct Consumer {
  Smem sm;
  int cw, lane;  // consumer index (q rows [64 cw, 64 cw + 64) of the tile), lane
  uint64_t desc_q;  // this work tile's Q buffer
  __device__ uint64_t desc_k(int st) const { return make_smem_desc_sw128(sm.k(st), 16, 1024); }
  __device__ uint64_t desc_v(int st) const {
    if constexpr (FP8 && VT_COLS == 64) return make_smem_desc_sw64(sm.v(st), 8 * VT_COLS);
    return make_smem_desc_sw128(sm.v(st), FP8 ? 16 : KV_BLOCK_BYTES, 1024);
  }
  // Each consumer warp releases a K (V) buffer once its wgmmas reading it are complete.
  __device__ void release_k(int st) const {
    if (lane == 0) mbar_arrive(sm.empty_k(st));
  }
  __device__ void release_v(int st) const {
    if (lane == 0) mbar_arrive(sm.empty_v(st));
  }
  // Pingpong turn-taking between the two consumers (no-ops without PINGPONG).
  __device__ void schedule_wait() const {
    if (PINGPONG) named_bar_sync(BAR_SCHEDULE + cw, 256);
  }
  __device__ void schedule_pass() const {
    if (PINGPONG) named_bar_arrive(BAR_SCHEDULE + (cw ^ 1), 256);
  }
};

// A consumer thread's registers (references to its arrays): S, P (the A fragments of P V's k steps), O,
// and per row the running max m (softmax domain), partial sum l and O's pending rescale alpha.
struct Regs {
  float (&s)[NS];
  uint32_t (&p)[KSTEPS_PV][4];
  float (&o)[NO];
  float (&m)[2], (&l)[2], (&alpha)[2];
};

// What the scores of a work tile's kv tiles need (score_kv_tile's arguments besides the tile's indices).
struct TileCtx {
  const CapturedArgs& C;
  const TileArgs& t;
  int i;
  const HeadCtx& hc;
  const RowCtx (&rc)[MT][2];
  const int (&qi)[MT][2];
  int tig;
  float scale;
  // REL_STAGED: this warp's slots of relative terms, this thread's first slot there (rel_slot_base), the q_idx of
  // the warp's first row, the lane
  uint32_t rel_slots, rel_base;
  int q_warp, lane;
};

// A relative score mod's terms for kv tile jn into the warp's slots (REL_STAGED), issued ahead of the wait for its S.
__device__ __forceinline__ void stage_rel(const TileCtx& w, int jn) {
#if ATTNGEN_SCORE_REL
  if constexpr (REL_STAGED) stage_rel_terms<BK / 8>(w.rel_slots, w.scale, w.C, w.t, w.hc, w.q_warp, jn * BK, w.lane);
#endif
}

// O += P V for the kv tile in ring slot v_stage (P from registers), one commit group; the caller has rescaled O
// (not in flight) and waited for the V tile.
__device__ __forceinline__ void issue_pv(const Consumer& c, int v_stage, const Regs& r) {
  wgmma_fence();
  if constexpr (FP8)
    wgmma_rs_kmajor<Elem, D, KSTEPS_PV, VT_COLS, VT_BLOCK_BYTES>(r.o, r.p, c.desc_v(v_stage));
  else
    wgmma_rs_mnmajor<Elem, D, KSTEPS_PV>(r.o, r.p, c.desc_v(v_stage));
  wgmma_commit();
}

// The scores of kv tile jn (S complete in r.s) and their online softmax.
__device__ __forceinline__ void score_softmax(const TileCtx& w, const Regs& r, int jn, int f_lo, int f_hi) {
  score_kv_tile</*RAW=*/true, BQ, BK, REL_STAGED>(r.s, jn, f_lo, f_hi, w.scale, w.C, w.t, w.i, w.hc, w.rc, w.qi, w.tig,
                                                  w.rel_base);
  online_softmax<P_OFFSET>(r.s, raw_score_factor(w.scale, w.C, w.hc), RESCALE_THRESHOLD, r.m, r.l, r.alpha);
}

// One step of the consumer loop, the same in both loop modes: with QK, S = Q K^T for kv tile jn (ring
// slot k_stage; [f_lo, f_hi) are the FULL kv tiles), its scores and softmax, P packed; with PV,
// O = alpha O + P V for the previous tile (slot v_stage). With both (the overlapped steady state) P V is
// issued right behind Q K^T so that it runs under the softmax. In one basic block ptxas puts the wait for it
// ahead of most of the softmax; the other consumer's wgmmas fill that gap. PIN_SOFTMAX puts the softmax in a
// block of its own behind a branch ptxas cannot fold (QLEN > 0 always holds in a launched kernel), which keeps
// the wait after it: slower for 16-bit inputs, measured for FP8 (docs/performance.md).
template <bool QK, bool PV>
__device__ __forceinline__ void step(const Consumer& c, int k_stage, uint32_t k_phase, int v_stage, uint32_t v_phase,
                                     int jn, int f_lo, int f_hi, const TileCtx& w, const Regs& r) {
  if (QK) {
    mbar_wait(c.sm.full_k(k_stage), k_phase);
    c.schedule_wait();
    wgmma_fence();
    wgmma_ss_kmajor<Elem, BK, KSTEPS_QK, Q_BLOCK_BYTES, KV_BLOCK_BYTES>(r.s, c.desc_q, c.desc_k(k_stage));
    wgmma_commit();
  }
  if (PV) {
    rescale_o(r.o, r.alpha);  // O is not in flight; issue_pv's fence orders this before P V
    mbar_wait(c.sm.full_v(v_stage), v_phase);
    if (!QK) c.schedule_wait();
    issue_pv(c, v_stage, r);
  }
  c.schedule_pass();
  if (QK) {
    stage_rel(w, jn);
    wgmma_wait<PV ? 1 : 0>();  // S complete (its K slot is free); P V may still run
    fence_regs(r.s);
    c.release_k(k_stage);
    if (!(PIN_SOFTMAX && PV) || w.t.QLEN > 0) score_softmax(w, r, jn, f_lo, f_hi);
  }
  if (PV) {
    wgmma_wait<0>();  // P V complete: its V slot is free, p may be overwritten
    fence_regs(r.o);
    fence_regs(r.p);
    c.release_v(v_stage);
  }
  if (QK) pack_a_frags<Elem, BK>(r.s, r.p);
}

// CROSS_TILE (persistent grid, overlapped loop, two Q buffers): a work tile's last P V and the next tile's first
// Q K^T are issued together, and this tile's epilogue runs under that Q K^T, where the tensor cores would otherwise
// wait for the epilogue, the next tile's set-up and its first Q K^T (tiles.py says why it is off by default).
constexpr bool CROSS_ACTIVE = CROSS_TILE && OVERLAP && PERSISTENT && QBUFS == 2;  // the switch where it applies

// O_STAGED: the epilogue writes O into its work tile's Q buffer (each consumer its own 64 rows, which its wgmmas no
// longer read) and one thread per consumer stores it with TMA, so the consumers leave a tile after a few shared-memory
// stores rather than a row's worth of global stores per thread. That thread hands the buffer back to the producer
// once the store has read it: after the next tile's first Q K^T where the producer refills it only for the tile after
// next (two Q buffers), at once where it refills it for the next (O_STAGED_WAIT: one Q buffer on the persistent
// grid). O as wide as Q only (not FP8), and not with CROSS_TILE (its epilogue runs under the next tile's Q K^T).
constexpr bool O_STAGED_ACTIVE = O_STAGED && !CROSS_ACTIVE && sizeof(OutElem) == sizeof(Elem);
constexpr bool O_STAGED_WAIT = O_STAGED_ACTIVE && PERSISTENT && QBUFS == 1;
constexpr uint32_t BAR_O_STAGED = BAR_SCHEDULE + NUM_CONSUMERS;  // + consumer index: its rows of O staged

// The last P V of a tile (slot v_stage) and the next tile's first Q K^T (its Q buffer in c_next, K slot k_stage,
// kv tile jn) in one turn, which waits for that Q and K while it holds the turn; then, with P V complete,
// `epilogue` under the Q K^T; then the next tile's scores and softmax from fresh statistics (O zeroed), P packed.
// With an epilogue that branches (masked rows, captured tensors) ptxas serializes the wgmmas around it (C7520).
template <class Epilogue>
__device__ __forceinline__ void cross_step(const Consumer& c, const Consumer& c_next, uint32_t q_bar, uint32_t q_par,
                                           int k_stage, uint32_t k_phase, int v_stage, uint32_t v_phase, int jn,
                                           int f_lo, int f_hi, const TileCtx& w, const Regs& r, Epilogue epilogue) {
  rescale_o(r.o, r.alpha);
  mbar_wait(c.sm.full_v(v_stage), v_phase);
  c.schedule_wait();
  issue_pv(c, v_stage, r);
  mbar_wait(q_bar, q_par);
  mbar_wait(c.sm.full_k(k_stage), k_phase);
  wgmma_ss_kmajor<Elem, BK, KSTEPS_QK, Q_BLOCK_BYTES, KV_BLOCK_BYTES>(r.s, c_next.desc_q, c.desc_k(k_stage));
  wgmma_commit();
  c.schedule_pass();
  stage_rel(w, jn);
  wgmma_wait<1>();  // P V complete (the Q K^T may still run): O final, its V slot free
  fence_regs(r.o);
  fence_regs(r.p);
  c.release_v(v_stage);
  epilogue();
#pragma unroll
  for (int n = 0; n < NO; ++n) r.o[n] = 0.f;
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    r.m[rh] = -INFINITY;
    r.l[rh] = 0.f;
    r.alpha[rh] = 1.f;
  }
  wgmma_wait<0>();
  fence_regs(r.s);
  c.release_k(k_stage);
  score_softmax(w, r, jn, f_lo, f_hi);
  pack_a_frags<Elem, BK>(r.s, r.p);
}

// The consumer warpgroup wg's work: every work tile the producer announces (or this CTA's one tile).
__device__ __forceinline__ void consume(const AttngenFwdArgs& a, const CUtensorMap* tm_o, const Smem& sm, int wg) {
  const int cw = wg - 1;
  const int tid = (int)threadIdx.x - 128 * wg;    // thread in the warpgroup
  const int lane = tid & 31;
  const int wq = tid >> 5;                        // warp in the warpgroup: rows 16 wq .. 16 wq + 15
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int r0 = cw * 64 + wq * 16 + g;           // this thread's tile rows: r0 and r0 + 8
  const CapturedArgs& C = a.captured;
  const float scale = a.scale;
  int stage = 0;
  uint32_t phase = 0;  // the ring carries on from work tile to work tile
  uint32_t n = 0;      // work tiles received so far (the mailbox's and the Q buffers' phases)
  const bool ascending = ascending_order(sm);
  if (PINGPONG && cw == 1) named_bar_arrive(BAR_SCHEDULE + 0, 256);  // consumer 0 takes the first turn

  // The work tile in hand: set up by `take`, which CROSS_ACTIVE calls for the next tile before this one's epilogue.
  Consumer c{sm, cw, lane, 0};
  int qb = 0, i = 0;
  uint32_t qpar = 0;
  TileArgs t;
  KvRange tr;
  HeadCtx hc;
  float tile_scale = scale, o_scale = 1.f;
  int qi[MT][2];
  RowCtx rc[MT][2];
  int q_warp = 0;  // the q_idx of this warp's first row (REL_STAGED)
  const uint32_t rel_slots = REL_STAGED ? sm.rel(cw * 4 + wq) : 0u;
  const uint32_t rel_base = REL_STAGED ? rel_slot_base(rel_slots, lane) : 0u;
  auto take = [&](int wt) {
    qb = q_buffer(n);
    qpar = q_parity(n);
    ++n;
    c.desc_q = make_smem_desc_sw128(sm.q(qb) + cw * 64 * 128, 16, 1024);
    t = tile_args<BQ>(a, wt, i, ascending);
    tr = kv_range<BQ, BK>(C, t, i);
    hc = head_ctx(C, t.b, t.h);
    tile_scale = scale;
    o_scale = 1.f;
    if constexpr (FP8) fp8_descale(a, t.b, t.h, tile_scale, o_scale);
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      // Rows past QLEN are computed (never stored) with the last valid row's index, so mods that load
      // captured tensors at q_idx stay in bounds.
      qi[0][rh] = min(i * BQ + r0 + rh * 8, t.QLEN - 1) + t.QOFF;
      rc[0][rh] = row_ctx(C, hc, qi[0][rh]);
    }
    q_warp = i * BQ + cw * 64 + wq * 16 + t.QOFF;
  };
  auto first_kv_tile = [&]() { return next_kv_tile<BQ, BK>(C, t, i, tr.j_begin, tr.j_end, tr.f_lo, tr.f_hi, tr); };

  float o[NO];
  float m[2], l[2], alpha[2];  // per row: running max (softmax domain, see online_softmax), partial sum of
                               // 2^(c (x - m) + P_OFFSET), O's pending rescale (applied just before the next P V)
  float s[NS];
  uint32_t p[KSTEPS_PV][4];
  const Regs r{s, p, o, m, l, alpha};
  auto fresh = [&]() {
#pragma unroll
    for (int k = 0; k < NO; ++k) o[k] = 0.f;
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      m[rh] = -INFINITY;
      l[rh] = 0.f;
      alpha[rh] = 1.f;
    }
  };

  // O_STAGED_ACTIVE: the Q buffer whose O store this consumer's thread 0 issued and has not yet handed back (-1: none)
  int staged_qb = -1;
  auto release_staged = [&]() {
    if (O_STAGED_ACTIVE && staged_qb >= 0) {
      if (tid == 0) {
        bulk_wait_read<0>();
        mbar_arrive(sm.bar_q_empty(staged_qb));
      }
      staged_qb = -1;
    }
  };

  int wt = PERSISTENT ? sm.mailbox().receive(n & 1u) : (int)blockIdx.x;
  if (wt >= 0) take(wt);
  bool primed = false;  // the tile's first Q K^T is done, its P packed (cross_step did it)
  int j = 0;
  while (wt >= 0) {
    // this tile's (what it refers to, `take` replaces)
    const TileCtx w{C, t, i, hc, rc, qi, tig, tile_scale, rel_slots, rel_base, q_warp, lane};
    if (!primed) {
      fresh();
      mbar_wait(sm.bar_q(qb), qpar);
      j = first_kv_tile();
      if (OVERLAP && j < tr.j_end) step<true, false>(c, stage, phase, stage, phase, j, tr.f_lo, tr.f_hi, w, r);
    }
    release_staged();  // the last tile's O store has long read its Q buffer by now
    const bool has_kv = j < tr.j_end;  // the tile visits a kv tile (else its rows are fully masked)
    if (OVERLAP) {
      if (has_kv) {
        while (true) {
          const int jn = next_kv_tile<BQ, BK>(C, t, i, j + 1, tr.j_end, tr.f_lo, tr.f_hi, tr);
          if (jn >= tr.j_end) break;
          int nstage = stage;
          uint32_t nphase = phase;
          advance(nstage, nphase);
          step<true, true>(c, nstage, nphase, stage, phase, jn, tr.f_lo, tr.f_hi, w, r);
          j = jn;
          stage = nstage;
          phase = nphase;
        }
      }
    } else {
      for (; j < tr.j_end; j = next_kv_tile<BQ, BK>(C, t, i, j + 1, tr.j_end, tr.f_lo, tr.f_hi, tr)) {
        step<true, false>(c, stage, phase, stage, phase, j, tr.f_lo, tr.f_hi, w, r);
        step<false, true>(c, stage, phase, stage, phase, j, tr.f_lo, tr.f_hi, w, r);
        advance(stage, phase);
      }
    }
    // Every Q K^T of this tile is complete: the producer may refill its Q buffer (with two buffers, for the tile
    // after next), under this tile's last P V where one is pending; with O_STAGED_ACTIVE, warp 0's arrival waits
    // for the O store out of it (release_staged).
    if (lane == 0 && !(O_STAGED_ACTIVE && wq == 0)) mbar_arrive(sm.bar_q_empty(qb));

    // Epilogue: O staged in this tile's Q buffer for a TMA store (O_STAGED_ACTIVE), else straight from registers
    // to global memory. P's offset leaves the sums 2^P_OFFSET too large: l and O's factor scaled back exactly, for
    // the LSE. m and l stay this tile's until the epilogue has run; the rest of its context is copied (`take`
    // replaces it).
    float escale = o_scale;
    if constexpr (P_OFFSET != 0) {
      constexpr float unscale = 1.f / (float)(1 << P_OFFSET);
      l[0] *= unscale;
      l[1] *= unscale;
      escale *= unscale;
    }
    const float efactor = raw_score_factor(tile_scale, C, hc);
    const int eb = t.b, eh = t.h, erow = i * BQ + r0, ewg_row = i * BQ + cw * 64, eqb = qb;
    auto epilogue = [&]() {
      if constexpr (O_STAGED_ACTIVE) {
        const uint32_t rows = sm.q(eqb) + cw * 64 * 128;  // this consumer's rows of the tile's Q buffer
        stage_rows<OutElem, NO, Q_BLOCK_BYTES>(a, eb, eh, a.Lq, erow, tig, rows, wq, lane, o, m, l, efactor, escale);
        fence_proxy_async_smem();  // generic stores, read by the TMA store (the async proxy)
        named_bar_sync(BAR_O_STAGED + cw, 128);
        if (tid == 0) {
#pragma unroll
          for (int db = 0; db < DB; ++db)
            tma_store_4d(tm_o, rows + db * Q_BLOCK_BYTES, db * ROW_ELEMS, ewg_row, eh, eb);  // rows past Lq dropped
          bulk_commit();
          if constexpr (O_STAGED_WAIT) {
            bulk_wait_read<0>();
            mbar_arrive(sm.bar_q_empty(eqb));
          }
        }
        if constexpr (!O_STAGED_WAIT) staged_qb = eqb;
      } else {
        store_rows<OutElem>(a, eb, eh, a.Lq, erow, tig, o, m, l, efactor, escale);
      }
    };

    const Consumer c_done = c;  // this tile's Q buffer (`take` replaces c's)
    if constexpr (CROSS_ACTIVE) {  // the next tile taken before this one's last P V
      wt = sm.mailbox().receive(n & 1u);
      if (wt >= 0) {
        take(wt);
        const int jn = first_kv_tile();
        if (has_kv && jn < tr.j_end) {
          int nstage = stage;
          uint32_t nphase = phase;
          advance(nstage, nphase);
          cross_step(c_done, c, sm.bar_q(qb), qpar, nstage, nphase, stage, phase, jn, tr.f_lo, tr.f_hi,
                     TileCtx{C, t, i, hc, rc, qi, tig, tile_scale, rel_slots, rel_base, q_warp, lane}, r, epilogue);
          stage = nstage;
          phase = nphase;
          j = jn;
          primed = true;
          continue;
        }
      }
    }
    if (OVERLAP && has_kv) {  // the last P V (a P V-only step reads no tile context)
      step<false, true>(c_done, stage, phase, stage, phase, j, 0, 0, w, r);
      advance(stage, phase);  // the next work tile starts at the next slot
    }
    epilogue();
    if constexpr (!CROSS_ACTIVE) {
      wt = PERSISTENT ? sm.mailbox().receive(n & 1u) : -1;
      if (wt >= 0) take(wt);
    }
    primed = false;
  }
  // The last O store must be complete before the CTA exits.
  if (O_STAGED_ACTIVE && tid == 0) bulk_wait_all();
  // Consumer 1's initial pass left one extra arrival on consumer 0's barrier: consume it, so that every
  // named barrier is balanced when the CTA exits.
  if (PINGPONG && cw == 0) named_bar_sync(BAR_SCHEDULE + 0, 256);
}

__global__ void __launch_bounds__(NTHREADS, 1)
    attngen_fwd_kernel(const __grid_constant__ AttngenFwdArgs a, const __grid_constant__ CUtensorMap tm_q,
                       const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                       const __grid_constant__ CUtensorMap tm_o, unsigned int* tile_counter,
                       int heads_per_kv /* Hq / Hkv, from the host: one division less for the 24-register producer,
                       which spilled its hoisted quotient */) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The runtime only promises 16-byte alignment of dynamic shared memory: align by hand.
  const Smem sm{(smem_addr(smem_raw) + 1023u) & ~1023u};
  if (threadIdx.x == 0) {
    for (int qb = 0; qb < QBUFS; ++qb) {
      mbar_init(sm.bar_q(qb), 1);
      mbar_init(sm.bar_q_empty(qb), 4 * NUM_CONSUMERS);  // consumers are done reading this Q tile
    }
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(sm.full_k(s), 1);                       // the producer's arrive.expect_tx (+ TMA bytes)
      mbar_init(sm.full_v(s), 1);
      mbar_init(sm.empty_k(s), 4 * NUM_CONSUMERS);      // one arrival per consumer warp
      mbar_init(sm.empty_v(s), 4 * NUM_CONSUMERS);
    }
    mbar_init(sm.mailbox().full, 1);                    // the producer wrote the tile id
    mbar_init(sm.mailbox().empty, 128 * NUM_CONSUMERS);  // every consumer thread has read it
    mbar_fence_init();
    if constexpr (ORDER_AT_RUN_TIME)
      st_shared_b32(sm.order(), ascending_q_blocks(a) ? 1u : 0u);
  }
  pdl_launch_dependents<PDL>();
  pdl_wait<PDL>();  // PDL: launched while the kernel ahead (a V^T copy, a previous call) drains
  __syncthreads();

  // Warp-uniform warpgroup index (the shuffle tells the compiler it is uniform).
  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
  if (wg == 0) {
    setmaxnreg_dec<PRODUCER_REGS>();
    if (threadIdx.x == 0) produce(a, tm_q, tm_k, tm_v, sm, tile_counter, heads_per_kv);
    return;
  }
  setmaxnreg_inc<CONSUMER_REGS>();
  consume(a, &tm_o, sm, wg);
}

// ------------------------------------------------------------------------------------------- host side

AttngenKernelInfo kernel_info() {
  return {ATTNGEN_ABI_VERSION, (int)sizeof(AttngenFwdArgs), D, kDtypeCode, BQ, BK, NTHREADS, SMEM_BYTES, kArch};
}

// The row max is taken over raw q.k (score_tile, RAW), or over a(d) q.k for a score_mod a(d) s (score_tile_rel,
// ATTNGEN_SCORE_REL_SCALES): only a positive scale keeps its order.
bool accepts_scale(float scale) {
  return (ATTNGEN_HAS_SCORE_MOD && !(ATTNGEN_SCORE_REL && ATTNGEN_SCORE_REL_SCALES)) || scale > 0.f;
}

int launch(const AttngenFwdArgs& a, cudaStream_t stream) {
  if (FP8 && a.descale == nullptr) return (int)cudaErrorInvalidValue;  // entered without attngen/fp8.py's V^T, descales
  int dev = 0, sms = 0;
  const cudaError_t err = prepare_device(attngen_fwd_kernel, SMEM_BYTES, dev, sms);  // before the driver calls
  if (err != cudaSuccess) return (int)err;
  // Tensor maps (host only, no GPU work): Q boxes of BQ rows, K/V boxes of BK rows.
  CUtensorMap tm_q, tm_k, tm_v;
  const int rc = tma_encode_qkv(a, kDtypeCode, D, BQ, BK, FP8 ? VT_COLS : 0, tm_q, tm_k, tm_v);
  if (rc != 0) return rc;
  CUtensorMap tm_o = {};  // O_STAGED_ACTIVE: boxes of one consumer's 64 rows
  if constexpr (O_STAGED_ACTIVE) {
    static thread_local TmaMapMemo memo_o;
    if (tma_encode_bhld_memo(memo_o, &tm_o, a.o, kDtypeCode, D, a.B, a.Hq, a.Lq, a.o_stride, 64) != CUDA_SUCCESS)
      return ATTNGEN_ERROR_SM90_TMA_LAYOUT;
  }

  // One CTA per SM walking work tiles (PERSISTENT, up to PERSISTENT_MAX_KV kv rows when that is set), or
  // one CTA per work tile.
  const long long tiles = (long long)((a.Lq + BQ - 1) / BQ) * a.Hq * a.B;
  if (tiles > 0x7fffffffLL) return (int)cudaErrorInvalidConfiguration;
  const bool persistent = PERSISTENT && (PERSISTENT_MAX_KV <= 0 || a.Lk <= PERSISTENT_MAX_KV);
  const long long ctas = persistent ? (tiles < sms ? tiles : (long long)sms) : tiles;
  // A grid of one CTA per tile has nothing left to take: it needs no counter.
  unsigned int* counter = persistent && ctas < tiles ? counter_for_launch(dev, stream) : nullptr;
  return (int)launch_kernel(PDL, attngen_fwd_kernel, dim3((unsigned)ctas), dim3(NTHREADS), SMEM_BYTES, stream, a, tm_q,
                            tm_k, tm_v, tm_o, counter, a.Hq / a.Hkv);
}

}  // namespace

#if ATTNGEN_FP8_LIBRARY
#include "fp8_v_transpose.cuh"
#endif
