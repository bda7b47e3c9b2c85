// bwd_sm90.cuh: attention backward for sm_90a (Hopper), FlashAttention-3 style, warp specialized, in three
// launches on one stream: bwd_pre.cuh's preprocess (delta, lse in log2, dQ_acc's first-store flags or dQ_acc
// itself zeroed), the main kernel, its own postprocess (dQ = dQ_acc * scale, bwd_dq.cuh). A work tile is kv-block j
// (BK = 128 rows) of one kv head, low kv blocks first (under causal-like masks they see the most q blocks); a CTA
// per SM takes tiles from a counter in that order and loads the next tile's K and V while it stores this one's dK
// and dV (PERSISTENT; deterministic mode launches a CTA per tile).
// Warpgroup 0 loads: a lane of warp 3 names each work tile and loads its K and V (load_kv_tiles); warp 0 walks the
// q-blocks the mask does not prove EMPTY (block_range_bwd.cuh, over the query heads that share the kv head), its
// lane 0 loading their Q and dO tiles (TMA, 128-byte swizzle) and row statistics (bulk copies) into a STAGES-deep
// ring (produce); warps 1 and 2 are the consumers' dQ writers (write_dq, bwd_dq.cuh). Warpgroups 1 and 2 each own
// 64 kv rows and, per q-block of BQ rows (64; 80 on full attention's first rung at head dim 128, jit/tiles.py),
// with wgmma:
//   S^T = K Q^T and dP^T = V dO^T (both operands from shared memory), then in registers P^T and
//   dS^T = P^T (dP^T - delta) [* d score_mod / d score] (bwd_probs.cuh, one pass; DS_FROM_PACKED: from P^T as
//   packed for dV's product, grad_scores_from_packed_t; DS_MUL_PACKED: multiplied as bf16 pairs,
//   grad_scores_mul_packed_t; STATS_EARLY: lse and delta read into registers ahead of the products, load_stat_pairs);
//   dV += P^T dO and dK += dS^T Q (A from registers, B = dO / Q read MN-major);
//   dS^T to shared memory (DS_STMATRIX: with stmatrix), then dQ = dS K (dQ^T = K^T dS^T at BQ = 80; both operands
//   MN-major from shared memory), staged in shared memory
//   for warp 1 + consumer of warpgroup 0 to add to the fp32 dQ_acc with one bulk reduction;
//   sm90_bwd_layout.cuh says how dQ is split;
//   the gradients of captured tensors the call asks for summed per tile (bwd_grad_sites.cuh) under dQ's product;
//   with S_AHEAD, the next q-block's S^T issued by this step (under dQ's product or its staging), the walk's first by
//   a prologue, so that a step begins with its S^T done.
// With WAIT_NS, the tile loader's, the producer's and the dQ writers' mbarrier waits carry a suspend-time hint, so that
// they poll a few times per wait rather than once per the hardware's default limit (bwd_dq.cuh: the writers' end).
// dK is scaled once at a tile's end, dQ in the postprocess. Configuration (Elem, D, BQ, BK, STAGES, kDtypeCode,
// kArch) and variant.inc come from the including attngen_bwd.cu (templates/attngen_bwd.cu.j2).
#pragma once

#include "attngen_common.cuh"
#include "attngen_bwd_abi.cuh"
#include "sm80_mma.cuh"   // smem_addr, st_shared_b32, pack2, unpack2
#include "sm90_mbarrier.cuh"
#include "sm90_tma.cuh"
#include "sm90_wgmma.cuh"
#include "sm90_bwd_layout.cuh"
#include "tile_sections.cuh"
#include "block_range_bwd.cuh"
#include "bwd_dq.cuh"
#include "bwd_probs.cuh"
#include "bwd_pre.cuh"
#include "epilogue.cuh"  // stage_rows_sw128
#include "host_abi_bwd.cuh"

namespace {

using namespace attngen;

// Where one work tile's walk starts: its kv block, kv head, batch, and the query heads [h0, h_end) sharing the kv
// head.
struct BwdCta {
  int j, kvh, b, h_end;
  TileArgs t;  // t.h: the walk's first query head
};

// Work tiles in launch order: (batch, kv head) pairs in sections of about one wave of tiles (tile_sections.cuh), the
// kv block slowest within a section with SECTIONS, else fastest (one pair a section). The CTAs running at once share
// a few heads' Q and dO in L2; under causal-like masks the low kv blocks walk the most q blocks, and in sections they
// start first across the section's pairs, so that the grid's last tiles are short ones (one pair a section ends on the
// last head's long walks).
// Persistent CTAs (one per SM, the tiles after the first from tile_counter) unless the call is deterministic: its
// turns wait on lower kv blocks, which a CTA per tile in launch order reaches first, and a persistent CTA holding
// its SM while a lower tile's CTA is not resident could wait for good.
__host__ __device__ __forceinline__ bool persistent_walks(const AttngenBwdArgs& a) {
  return PERSISTENT && a.tile_counter != nullptr && a.dq_semaphore == nullptr;
}

// Work tiles per (batch, kv head): its kv blocks.
__host__ __device__ __forceinline__ int tile_blocks(const AttngenBwdArgs& a) { return (a.Lk + BK - 1) / BK; }

__host__ __device__ __forceinline__ int num_work_tiles(const AttngenBwdArgs& a) { return tile_blocks(a) * a.Hkv * a.B; }

// The tile loader names a work tile to the producer warp and the consumers by its fields in a slot of shared memory
// (j < 0: no more tiles), so that they do not divide by runtime counts: ptxas hoists such divisions' constants out
// of the loop over tiles, where the producer's few registers (setmaxnreg) cannot hold them.
__device__ __forceinline__ void put_tile(int* slot, const BwdCta& c) {
  volatile int* v = slot;
  v[0] = c.j;
  v[1] = c.kvh;
  v[2] = c.b;
  v[3] = c.t.h;
  v[4] = c.h_end;
}

// The TileArgs fields that come from the call, and the tile's batch.
__device__ __forceinline__ void set_call_fields(const AttngenBwdArgs& a, BwdCta& c) {
  c.t.QLEN = a.Lq;
  c.t.KVLEN = a.Lk;
  c.t.QOFF = a.q_offset;
  c.t.b = c.b;
}

__device__ __forceinline__ BwdCta take_tile(const AttngenBwdArgs& a, const int* slot) {
  const volatile int* v = slot;
  BwdCta c;
  c.j = v[0];
  c.kvh = v[1];
  c.b = v[2];
  c.t.h = v[3];
  c.h_end = v[4];
  set_call_fields(a, c);
  return c;
}

// How the work tiles are cut into sections: kv blocks per pair, (batch, kv head) pairs, pairs per section (nkb > 0).
struct BwdSections {
  int nkb, pairs, sp;
};
__host__ __device__ __forceinline__ BwdSections bwd_sections(const AttngenBwdArgs& a) {
  const int nkb = tile_blocks(a), pairs = a.Hkv * a.B;
  return {nkb, pairs, SECTIONS ? section_pairs(nkb, pairs) : 1};
}

__device__ __forceinline__ BwdCta bwd_cta(const AttngenBwdArgs& a, int w) {
  const BwdSections g = bwd_sections(a);
  const SectionTile st = section_tile(w, g.nkb, g.pairs, g.sp);
  BwdCta c;
  c.j = st.block;
  c.kvh = st.pair % a.Hkv;
  c.b = st.pair / a.Hkv;
  const int group = a.Hq / a.Hkv;  // GQA / MQA: consecutive query heads share a kv head
  c.h_end = (c.kvh + 1) * group;
  set_call_fields(a, c);
  c.t.h = c.kvh * group;
  return c;
}

// The walk is rotated by WALK_SHIFT (block_range_bwd.cuh walk_rotation), except in deterministic mode, whose
// turns would then wait on kv blocks that reach the tile late in their walks.
__device__ __forceinline__ int walk_shift(const AttngenBwdArgs& a) { return a.dq_semaphore != nullptr ? 0 : WALK_SHIFT; }

__device__ __forceinline__ QStep first_q_tile(const AttngenBwdArgs& a, const BwdCta& c) {
  const int shift = walk_shift(a);
  return next_q_tile<BQ, BK>(a.captured, c.t, c.j, q_range<BQ, BK>(a.captured, c.t, c.j, shift), c.h_end, shift);
}

__device__ __forceinline__ QStep following_q_tile(const AttngenBwdArgs& a, const BwdCta& c, QStep s) {
  ++s.i;
  return next_q_tile<BQ, BK>(a.captured, c.t, c.j, s, c.h_end, walk_shift(a));
}

// ------------------------------------------------------------------------------------------ tile order
// With ORDER, outside deterministic mode (whose turns need each kv block's lower ones launched first), the
// preprocess's first blocks sort each section's work tiles (bwd_sections: whole (batch, kv head) pairs, a
// contiguous run of w; one pair without SECTIONS) by the length of their walks, longest first, ties in launch order, into
// a.tile_order, and the tile loader takes tiles by it: the grid then ends on short walks whatever the mask, runtime
// summaries (documents) included. A section longer than kOrderMax tiles (one head's kv blocks past S = 128k) keeps
// its launch order.
constexpr int kOrderMax = 1024;

__host__ __device__ __forceinline__ bool ordered_walks(const AttngenBwdArgs& a) {
  return ORDER && a.tile_order != nullptr && a.dq_semaphore == nullptr;
}

// Sections to sort, one preprocess block each (none without kv blocks: section_pairs divides by their count).
__host__ __device__ __forceinline__ int order_sections(const AttngenBwdArgs& a) {
  if (a.Lk <= 0 || a.Hkv * a.B == 0) return 0;
  const BwdSections g = bwd_sections(a);
  return (g.pairs + g.sp - 1) / g.sp;
}

struct OrderSection {  // the preprocess's extra blocks (bwd_pre.cuh), one per section
  __device__ static void block(const AttngenBwdArgs& a, int sec) {
    __shared__ int walk[kOrderMax];
    const BwdSections g = bwd_sections(a);
    const int first = sec * g.sp * g.nkb;
    const int n = min(g.sp, g.pairs - sec * g.sp) * g.nkb;
    if (n > kOrderMax) {
      for (int t = threadIdx.x; t < n; t += blockDim.x) a.tile_order[first + t] = first + t;
      return;
    }
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
      const BwdCta c = bwd_cta(a, first + t);
      int steps = 0;
      for (QStep s = first_q_tile(a, c); s.h < c.h_end; s = following_q_tile(a, c, s)) ++steps;
      walk[t] = steps;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
      const int mine = walk[t];
      int rank = 0;
      for (int u = 0; u < n; ++u) rank += walk[u] > mine || (walk[u] == mine && u < t);
      a.tile_order[first + rank] = first + t;
    }
  }
};

// ------------------------------------------------------------------------------------------- producer
// The Q, dO and statistics of one work tile's walk into the ring. Warp 0 runs the walk, every lane alike, so that
// ptxas can keep its kernel-argument arithmetic in uniform registers (the warpgroup's setmaxnreg leaves 24 per
// thread); lane 0 issues the copies. ring: the count of the ring's slots filled so far (slot n % STAGES, phase
// n / STAGES % 2), alike in every lane, so ptxas keeps it in a uniform register (a copy per lane in shared memory
// took the walk out of uniform registers: vector arithmetic and 24 R2UR per q-block around the copies).
__device__ __forceinline__ void produce_walk(const AttngenBwdArgs& a, const CUtensorMap& tm_q, const CUtensorMap& tm_do,
                                             const BwdSmem& sm, const BwdCta& c, bool leader, uint32_t& ring) {
  for (QStep s = first_q_tile(a, c); s.h < c.h_end; s = following_q_tile(a, c, s)) {
    const uint32_t filled = ring++;
    const int stage = (int)(filled % STAGES);
    mbar_wait_for<WAIT_NS>(sm.empty(stage), ((filled / STAGES) & 1u) ^ 1u);
    if (leader) {
      const uint32_t full = sm.full(stage);
      mbar_arrive_expect_tx(full, 2 * Q_BYTES + STATS_BYTES);
#pragma unroll
      for (int db = 0; db < DB; ++db) {
        tma_load_4d(sm.q(stage) + db * Q_BLOCK_BYTES, &tm_q, full, db * 64, s.i * BQ, s.h, c.b);
        tma_load_4d(sm.dout(stage) + db * Q_BLOCK_BYTES, &tm_do, full, db * 64, s.i * BQ, s.h, c.b);
      }
      const int Lq_pad = (a.Lq + BQ - 1) / BQ * BQ;
      // (b, h) in 32 bits: B * Hq heads of Lq_pad rows fit no GPU's memory past 2^31
      const long long row = (long long)(c.b * a.Hq + s.h) * Lq_pad + s.i * BQ;
      bulk_load_1d(sm.stats(stage), a.lse_log2 + row, BQ * 4, full);
      bulk_load_1d(sm.stats(stage) + BQ * 4, a.delta + row, BQ * 4, full);
    }
  }
}

// Warp 0: the walks' Q, dO and statistics, tile after tile as the tile loader names them (the ring runs on across
// tiles).
__device__ __forceinline__ void produce(const AttngenBwdArgs& a, const CUtensorMap& tm_q, const CUtensorMap& tm_do,
                                        const BwdSmem& sm, int lane) {
  const bool leader = lane == 0;
  if (leader) {
    tma_prefetch_map(&tm_q);
    tma_prefetch_map(&tm_do);
  }
  uint32_t ring = 0u;
  for (uint32_t turn = 0;; ++turn) {
    mbar_wait_for<WAIT_NS>(sm.tile_full(), turn & 1u);
    const BwdCta c = take_tile(a, sm.tile(turn & 1u));
    if (c.j < 0) return;
    produce_walk(a, tm_q, tm_do, sm, c, leader, ring);
    __syncwarp();  // every lane has read the slot
    // this tile's slot read and its tile_full phase waited for, its walk empty or not: without this arrival the
    // consumers of an empty walk could let the loader publish two tiles before this warp waited for the first
    if (leader) mbar_arrive(sm.kv_empty());
  }
}

// Warp 3's lane, the tile loader: per work tile of the CTA, once the consumers are done with the last tile's K and
// V and the producer warp with its slot (kv_empty), the tile in its slot (tile_full) and its K and V (bar_kv);
// after the last, a slot with j = -1 and bar_kv armed without bytes end the walks. After its first tile
// (blockIdx.x) a persistent CTA takes the next from tile_counter only then, so that no CTA holds a tile while
// another goes idle at the end.
__device__ __forceinline__ void load_kv_tiles(const AttngenBwdArgs& a, const CUtensorMap& tm_k, const CUtensorMap& tm_v,
                                              const BwdSmem& sm) {
  const int ntiles = num_work_tiles(a);
  for (uint32_t turn = 0;; ++turn) {
    int w = (int)blockIdx.x;
    if (turn > 0) {
      mbar_wait_for<WAIT_NS>(sm.kv_empty(), (turn - 1u) & 1u);
      w = persistent_walks(a) ? atomicAdd(a.tile_counter, 1) + (int)gridDim.x : ntiles;
    }
    BwdCta c = bwd_cta(a, w < ntiles && ordered_walks(a) ? a.tile_order[w] : w);
    if (w >= ntiles) c.j = -1;
    put_tile(sm.tile(turn), c);
    mbar_arrive(sm.tile_full());
    if (w >= ntiles) {
      mbar_arrive(sm.bar_kv());
      return;
    }
    mbar_arrive_expect_tx(sm.bar_kv(), 2 * KV_BYTES);
#pragma unroll
    for (int db = 0; db < DB; ++db) {
      tma_load_4d(sm.k() + db * KV_BLOCK_BYTES, &tm_k, sm.bar_kv(), db * 64, c.j * BK, c.kvh, c.b);
      tma_load_4d(sm.v() + db * KV_BLOCK_BYTES, &tm_v, sm.bar_kv(), db * 64, c.j * BK, c.kvh, c.b);
    }
  }
}

// ------------------------------------------------------------------------------------------- consumers

// A 64 x N accumulator (sm90_wgmma.cuh's layout) seen as bwd_probs.cuh's m16n8 fragments [1][N / 8][4]:
// element 4j + 2rh + e of the first is element [0][j][2rh + e] of the second, in the same order.
template <int M>
__device__ __forceinline__ float (&as_frags(float (&x)[M]))[1][M / 4][4] {
  return *reinterpret_cast<float(*)[1][M / 4][4]>(&x);
}

// The byte offset in a dS^T buffer of row `row` (kv row of the tile), 16-byte chunk `chunk` of q step kk's 16 columns.
// BQ = 64: 128 bytes of q columns, chunk c of row r at chunk c ^ (r % 8) (the 128-byte swizzle the MN-major descriptor
// of dQ = dS K reads). DS_SW32: step kk's 16 q columns in column block kk (rows of 32 bytes), chunk c of row r at
// c ^ (r / 4 % 2) (sm90_bwd_layout.cuh).
__device__ __forceinline__ uint32_t ds_chunk_offset(int row, int kk, int chunk) {
  if constexpr (DS_SW32) return (uint32_t)(kk * DS_T_LBO + row * 32 + ((chunk ^ ((row >> 2) & 1)) << 4));
  else return (uint32_t)(row * 128 + (((2 * kk + chunk) ^ (row & 7)) << 4));
}

// dS^T (this thread's A fragments of the k16 steps over q) into buffer `ds` (ds_chunk_offset's layout). Fragment r of
// a step: rows r0 (+ 8 for odd r), columns 16 kk + 8 (r / 2) + 2 tig and + 1. DS_STMATRIX: a step's four fragments
// are the four 8 x 8 matrices of one stmatrix (the accumulator layout it takes), lane L naming row L % 8 of matrix
// L / 8, so a warp stores a step with one instruction instead of four.
__device__ __forceinline__ void store_ds(uint32_t ds, const uint32_t (&f)[KSTEPS_Q][4], int r0, int tig) {
  if constexpr (DS_STMATRIX) {
    const int g = r0 & 7;  // r0 = the warp's first row (a multiple of 8) + lane / 4
    const int m = (4 * g + tig) >> 3;  // the matrix this lane names: rows + 8 (m & 1), chunk + (m >> 1)
    const int row = r0 - g + 8 * (m & 1) + ((4 * g + tig) & 7);
#pragma unroll
    for (int kk = 0; kk < KSTEPS_Q; ++kk) stmatrix_x4(ds + ds_chunk_offset(row, kk, m >> 1), f[kk]);
    return;
  }
#pragma unroll
  for (int kk = 0; kk < KSTEPS_Q; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) st_shared_b32(ds + ds_chunk_offset(r0 + (r & 1) * 8, kk, r >> 1) + tig * 4, f[kk][r]);
  }
}

// This consumer's dQ fragment into its staging buffer in the accumulator's thread order (sm90_bwd_layout.cuh):
// each warp stores 512 contiguous bytes per float4, so no two lanes share a bank group.
__device__ __forceinline__ void stage_dq(uint32_t buf, const float (&dq)[NDQ], int tid) {
#pragma unroll
  for (int v = 0; v < NDQ / 4; ++v)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(buf + (uint32_t)((v * 128 + tid) * 16)),
                 "f"(dq[4 * v]), "f"(dq[4 * v + 1]), "f"(dq[4 * v + 2]), "f"(dq[4 * v + 3])
                 : "memory");
}

// A consumer thread's place in its warpgroup: its index, lane, warp, accumulator rows r0 and r0 + 8 (of 64) and
// column pair tig.
struct Place {
  int tid, lane, wq, tig, r0;
};
__device__ __forceinline__ Place place_of(int tid) {
  const int lane = tid & 31;
  return {tid, lane, tid >> 5, lane & 3, (tid >> 5) * 16 + (lane >> 2)};
}

// The place from the thread's special register, read where it is used (a consumer warpgroup is 128 aligned threads).
__device__ __forceinline__ Place place_now() {
  uint32_t t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return place_of((int)(t & 127u));
}

// DS_FROM_PACKED: dS^T = P^T (dP^T - delta) into dp, P^T read from its fragments packed for dV's product (elements
// i, i + 1 of the accumulator, i even, are the pair pa[i / 8][i % 8 / 2], pack_a_frags' order; their columns
// 8 (i / 4) + 2 tig + {0, 1}), so that the fp32 P^T need not live until dP^T's product is done.
template <class Delta>
__device__ __forceinline__ void grad_scores_from_packed_t(float (&dp)[NS], const uint32_t (&pa)[KSTEPS_Q][4],
                                                          const Delta& delta, int tig) {
#pragma unroll
  for (int i = 0; i < NS; i += 2) {
    const float2 d2 = stat_pair(delta, i / 4, tig);
    const float2 p = unpack2<Elem>(pa[i / 8][i % 8 / 2]);
    dp[i] = p.x * (dp[i] - d2.x);
    dp[i + 1] = p.y * (dp[i + 1] - d2.y);
  }
}

// DS_MUL_PACKED (bf16): dS^T = P^T (dP^T - delta) multiplied as bf16 pairs straight into dK's A fragments `da`:
// dP^T - delta in fp32, rounded to bf16 once (the eager implementation rounds dP^T itself before subtracting), times
// P^T as packed for dV's product (the pair order of grad_scores_from_packed_t): a pack and a mul.rn.bf16x2 per pair
// where unpacking P^T, two multiplies and packing dS^T took five instructions. bf16 only (kDsMulPacked): fp16's range
// would overflow dP^T - delta where P^T is small.
template <class Delta>
__device__ __forceinline__ void grad_scores_mul_packed_t(uint32_t (&da)[KSTEPS_Q][4], const float (&dp)[NS],
                                                        const uint32_t (&pa)[KSTEPS_Q][4], const Delta& delta,
                                                        int tig) {
#pragma unroll
  for (int i = 0; i < NS; i += 2) {
    const float2 d2 = stat_pair(delta, i / 4, tig);
    const uint32_t d = pack2<Elem>(dp[i] - d2.x, dp[i + 1] - d2.y);
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(da[i / 8][i % 8 / 2]) : "r"(pa[i / 8][i % 8 / 2]), "r"(d));
  }
}

// A finished dK or dV fragment (times f) to global memory, rows past KVLEN skipped.
__device__ __forceinline__ void store_kv_grad(void* out, const long long (&st)[3], int b, int kvh, int row0,
                                              int KVLEN, const float (&x)[NKV], float f, int tig) {
  Elem* base = static_cast<Elem*>(out) + (long long)b * st[0] + (long long)kvh * st[1];
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    const int row = row0 + rh * 8;
    if (row < KVLEN) {
      Elem* dst = base + (long long)row * st[2] + 2 * tig;
#pragma unroll
      for (int jj = 0; jj < D / 8; ++jj)
        *reinterpret_cast<uint32_t*>(dst + jj * 8) = pack2<Elem>(x[4 * jj + 2 * rh] * f, x[4 * jj + 2 * rh + 1] * f);
    }
  }
}

// SPLIT_PROBS where the probabilities need neither a score_mod's derivative nor its gradient sites, which the one
// pass takes from the raw score beside dP^T.
constexpr bool kSplitProbs = SPLIT_PROBS && !ATTNGEN_HAS_SCORE_MOD && kGradSites == 0;
// DS_MUL_PACKED with the split, bf16 only (grad_scores_mul_packed_t; fp16 keeps the fp32 products).
constexpr bool kDsMulPacked = kSplitProbs && DS_MUL_PACKED && kDtypeCode == 1;
// S_AHEAD (Sm90BwdTiles.s_ahead): each step issues the next q-block's S^T = K Q^T, 1 once dQ's product is done (under
// its staging), 2 once dV's and dK's are (under dQ's product too), so that the tensor cores have work while the step
// ends and the next begins with S^T done.
static_assert(S_AHEAD >= 0 && S_AHEAD <= 2, "S_AHEAD: 0, 1 or 2");
// STATS_EARLY (Sm90BwdTiles.stats_early) with the split: a step's delta (bit 0) read into registers before dV's
// product is issued, its lse (bit 1) before dP^T's, rather than where dS^T and the exponentials use them.
constexpr bool kLseEarly = kSplitProbs && (STATS_EARLY & 2) != 0;
constexpr bool kDeltaEarly = kSplitProbs && (STATS_EARLY & 1) != 0;

// x where FIRST, else y: the statistics in registers (StatPairs) or their pointer into shared memory.
template <bool FIRST, class X, class Y>
__device__ __forceinline__ const auto& either(const X& x, const Y& y) {
  if constexpr (FIRST) return x;
  else return y;
}

// DKV_STAGED: this consumer's rows of a finished dK (times `scale`) and dV in shared memory as TMA boxes of 64 kv
// rows: dK in its rows of the two dS^T buffers (free once both consumers' walks are over: at head dim 128 the other's dQ
// products read them), dV in the second at head dim 64, else in its staged-dQ buffer (free once its writer has read
// the last dQ, `dq_empty` at parity `dq_parity`); then one thread stores them. The next tile's first dS^T and dQ writes
// wait for those stores to have read them (the caller's `staged`).
__device__ __forceinline__ void stage_kv_grads(const AttngenBwdArgs& a, const CUtensorMap* tm_dk,
                                               const CUtensorMap* tm_dv, const BwdSmem& sm, const BwdCta& e, int cw,
                                               int tid, uint32_t dq_parity, const float (&dk)[NKV],
                                               const float (&dv)[NKV]) {
  const int wq = tid >> 5, lane = tid & 31;
  named_bar_sync(BAR_WALKS_DONE, 128 * NUM_CONSUMERS);
  const uint32_t rows_k = sm.ds(0) + (uint32_t)(cw * 64 * 128);
  const float fk[2] = {a.scale, a.scale}, fv[2] = {1.f, 1.f};
  stage_rows_sw128<Elem, NKV, DS_BYTES>(rows_k, dk, fk, wq, lane);
  uint32_t rows_v = sm.ds(1) + (uint32_t)(cw * 64 * 128);
  if constexpr (D != 64) {
    mbar_wait(sm.dq_empty(cw), dq_parity);
    rows_v = sm.dq(cw);
  }
  stage_rows_sw128<Elem, NKV, 64 * 128>(rows_v, dv, fv, wq, lane);
  fence_proxy_async_smem();  // generic stores, read by the TMA stores (the async proxy)
  named_bar_sync(BAR_DKV + cw, 128);
  if (tid == 0) {
    const int row = e.j * BK + cw * 64;  // rows past Lk are dropped by the maps
#pragma unroll
    for (int db = 0; db < DB; ++db) {
      tma_store_4d(tm_dk, rows_k + (uint32_t)(db * DS_BYTES), db * 64, row, e.kvh, e.b);
      tma_store_4d(tm_dv, rows_v + (uint32_t)(db * 64 * 128), db * 64, row, e.kvh, e.b);
    }
    bulk_commit();
  }
}

// S^T = K Q^T of this consumer's kv rows (desc_k) and the Q tile at q_tile (S_AHEAD: the accumulator write-only to
// the compiler at the first step, so that the loop-carried array holds no earlier value live up to the issue).
__device__ __forceinline__ void issue_scores_t(float (&st)[NS], uint64_t desc_k, uint32_t q_tile) {
  const uint64_t desc_q = make_smem_desc_sw128(q_tile, 16, 1024);
  if constexpr (S_AHEAD)
    wgmma_ss_kmajor_fresh<Elem, BQ, KSTEPS_D, KV_BLOCK_BYTES, Q_BLOCK_BYTES>(st, desc_k, desc_q);
  else
    wgmma_ss_kmajor<Elem, BQ, KSTEPS_D, KV_BLOCK_BYTES, Q_BLOCK_BYTES>(st, desc_k, desc_q);
}

// The consumer warpgroup wg's 64 kv rows through every visited q-block, then its rows of dK and dV.
__device__ __forceinline__ void consume(const AttngenBwdArgs& a, const CUtensorMap* tm_dk, const CUtensorMap* tm_dv,
                                        const BwdSmem& sm, int wg) {
  const int cw = wg - 1;
  const Place place = place_of((int)threadIdx.x - 128 * wg);
  const int tid = place.tid, lane = place.lane, wq = place.wq;
  // with lse held through the products (kLseEarly) the place is read again where each step and each tile's end use it:
  // held across the walk, its values spilled at 80 rows
  auto place_here = [&] { return kLseEarly ? place_now() : place; };
  const uint32_t rel_slots = sm.rel(cw * 4 + wq);  // REL_STAGED: this warp's relative terms, this thread's first
  const uint32_t rel_base = rel_slot_base_t(rel_slots, lane);
  const CapturedArgs& C = a.captured;
  const float scale = a.scale;

  // Descriptors (sm90_wgmma.cuh): K / V rows of this consumer as A (K-major); Q / dO as B of S^T and dP^T
  // (K-major) and as B of dK / dV (MN-major, LBO = distance of 64-column blocks); dS^T and K for dQ (MN-major).
  const uint64_t desc_k = make_smem_desc_sw128(sm.k() + cw * 64 * 128, 16, 1024);
  const uint64_t desc_v = make_smem_desc_sw128(sm.v() + cw * 64 * 128, 16, 1024);
  const uint32_t dq_ds_off = DQ_SPLIT_D ? 0u : (uint32_t)(cw * 64 * 128);
  const uint64_t desc_kt = DQ_SPLIT_D ? make_smem_desc_sw128(sm.k() + cw * (DQ_N / 64) * KV_BLOCK_BYTES, KV_BLOCK_BYTES, 1024)
                                      : make_smem_desc_sw128(sm.k() + cw * 64 * 128, KV_BLOCK_BYTES, 1024);

  // the captured tensors' gradients this call asks for (bwd_grad_sites.cuh)
  GradSites gs;
#pragma unroll
  for (int k = 0; k < kGradSites; ++k) {
    gs.dcap[k] = a.dcaptured[grad_site_slot(k)];
    gs.tile[k] = 0.f;
  }
  if (kGradDiagSites > 0) {
#pragma unroll
    for (int k = 0; k < kGradDiagSites; ++k)
      for (int buf = 0; buf < 2; ++buf)
        for (int i = tid; i < GRAD_SITE_FLOATS; i += 128) st_shared_b32(sm.bins(cw, buf) + 4u * (uint32_t)(k * GRAD_SITE_FLOATS + i), 0u);
    named_bar_sync(BAR_BINS + cw, 128);
  }

  // q-blocks done over the CTA's tiles: the ring slot (n % STAGES, its phase n / STAGES % 2), the dS^T buffer and the
  // staged dQ's hand-over parity (n % 2), all from one register
  uint32_t n = 0;
  bool staged = false;  // DKV_STAGED: the last tile's dK / dV stores may still read shared memory
  for (int turn = 0;; ++turn) {  // the CTA's work tiles, as the tile loader names them
    mbar_wait(sm.bar_kv(), (uint32_t)turn & 1u);
    // the tile's fields, read once: the same in every thread, so ptxas keeps them in uniform registers as it does
    // the landed kernel's blockIdx (read at each q-block, the shared-memory loads and what follows from them sat
    // on every step's path)
    const BwdCta c = take_tile(a, sm.tile(turn));
    if (c.j < 0) break;
    if (DKV_STAGED && staged) {  // before this tile writes its dS^T rows and staged dQ
      if (place_here().tid == 0) bulk_wait_read<0>();
      named_bar_sync(BAR_DKV + cw, 128);
      staged = false;
    }
    float dk[NKV], dv[NKV];
#pragma unroll
    for (int x = 0; x < NKV; ++x) dk[x] = dv[x] = 0.f;
    HeadCtx hc = head_ctx(C, c.b, c.t.h);
    ColCtx cc[1][2];
    int ctx_h = -1;
    // S_AHEAD: each step's S^T is issued by the step before (the walk's first by this prologue) and complete when the
    // step begins, so that no product is in flight over the walk's back edge (ptxas serializes every wgmma then)
    float s_ahead[NS];
    QStep s = first_q_tile(a, c);
    if (S_AHEAD && s.h < c.h_end) {
      const int stage = (int)(n % STAGES);
      mbar_wait(sm.full(stage), (n / STAGES) & 1u);
      wgmma_fence();
      issue_scores_t(s_ahead, desc_k, sm.q(stage));
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s_ahead);
    }
    for (; s.h < c.h_end; s = S_AHEAD ? s : following_q_tile(a, c, s), ++n) {  // S_AHEAD: the step moved s on
      TileArgs t = c.t;
      // j through an opaque copy at each step: kv0 and its clamps, hoisted out of the walk, would hold vector
      // registers across it (softcap + causal and prefix_lm spill at 240 then)
      int j = c.j;
      asm volatile("" : "+r"(j));
      const Place p = place_here();
      const int kv0 = j * BK + cw * 64 + p.r0;  // the kv position of this thread's first row
      const int kv_row0 = j * BK + cw * 64;  // this consumer's first kv row
      if (s.h != ctx_h) {  // a new query head: its HeadCtx and this thread's kv rows' ColCtx
        ctx_h = s.h;
        hc = head_ctx(C, c.b, s.h);
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) cc[0][rh] = col_ctx(C, hc, min(kv0 + rh * 8, t.KVLEN - 1));
      }
      t.h = s.h;
      const int q0 = s.i * BQ;
      const int stage = (int)(n % STAGES);
      // deterministic mode: thread 0 finds this tile's turn before the products hold registers, and keeps it in
      // shared memory (one register more across the tile spills)
      if (a.dq_semaphore != nullptr && p.tid == 0) sm.turn(cw)[0] = dq_turn(C, t, s.i, c.j);
      const float* lse2 = sm.stats_ptr(stage);
      const float* delta = lse2 + BQ;

      float st_here[NS], dp[NS];
      float (&st)[NS] = S_AHEAD ? s_ahead : st_here;  // the other array is never touched
      mbar_wait(sm.full(stage), (n / STAGES) & 1u);
      StatPairs<BQ / 8> lse_early, delta_early;  // kLseEarly, kDeltaEarly
      if constexpr (kLseEarly) lse_early = load_stat_pairs<BQ / 8>(sm.stats(stage), p.tig);
      wgmma_fence();
      if constexpr (!S_AHEAD) {
        issue_scores_t(st, desc_k, sm.q(stage));
        wgmma_commit();
      }
      wgmma_ss_kmajor<Elem, BQ, KSTEPS_D, KV_BLOCK_BYTES, Q_BLOCK_BYTES>(dp, desc_v,
                                                                       make_smem_desc_sw128(sm.dout(stage), 16, 1024));
      wgmma_commit();
      // mask_mod only where the tile is not known FULL, bounds on tiles past either end
      const bool masked = q_tile_masked<BQ, BK>(C, t, s, c.j);
      const bool bounds = q0 + BQ > t.QLEN || (c.j + 1) * BK > t.KVLEN;
      uint32_t pa[KSTEPS_Q][4], da[KSTEPS_Q][4];
      const uint32_t ds = sm.ds(n & 1);
      if constexpr (kSplitProbs) {
        // P^T into st while dP^T's product runs; dV += P^T dO issued before the wait for dP^T, so that dS^T runs
        // under it (product groups complete in order: the second wait leaves only dV's in flight)
        wgmma_wait<1>();
        fence_regs(st);
        // (without a score_mod probs_t writes no derivatives: its second array is st itself, unread)
        const auto& lse_in = either<kLseEarly>(lse_early, lse2);
        if constexpr (kDsMulPacked) {  // nothing reads the fp32 P^T once packed: packed on each side
          probs_t_for_then(masked, bounds, [&] { pack_a_frags<Elem, BQ>(st, pa); }, as_frags(st), as_frags(st), scale,
                           C, hc, cc, kv0, q0, t, lse_in, p.tig);
        } else {
          probs_t_for(masked, bounds, as_frags(st), as_frags(st), scale, C, hc, cc, kv0, q0, t, lse_in, p.tig);
          pack_a_frags<Elem, BQ>(st, pa);
        }
        if constexpr (kDeltaEarly) delta_early = load_stat_pairs<BQ / 8>(sm.stats(stage) + 4u * BQ, p.tig);
        const auto& delta_in = either<kDeltaEarly>(delta_early, delta);
        wgmma_fence();
        wgmma_rs_mnmajor<Elem, D, KSTEPS_Q>(dv, pa, make_smem_desc_sw128(sm.dout(stage), Q_BLOCK_BYTES, 1024));
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs(dp);
        if constexpr (kDsMulPacked) {
          grad_scores_mul_packed_t(da, dp, pa, delta_in, p.tig);
        } else if constexpr (DS_FROM_PACKED) {
          grad_scores_from_packed_t(dp, pa, delta_in, p.tig);  // dS^T into dp
          pack_a_frags<Elem, BQ>(dp, da);
        } else {
          grad_scores_t(as_frags(st), as_frags(dp), as_frags(dp), delta_in, p.tig);  // dS^T into st (no derivatives read)
          pack_a_frags<Elem, BQ>(st, da);
        }
        store_ds(ds, da, cw * 64 + p.r0, p.tig);
        wgmma_fence();
        wgmma_rs_mnmajor<Elem, D, KSTEPS_Q>(dk, da, make_smem_desc_sw128(sm.q(stage), Q_BLOCK_BYTES, 1024));
        wgmma_commit();
      } else {
        wgmma_wait<0>();
        fence_regs(st);
        fence_regs(dp);
#if ATTNGEN_REL_STAGEABLE
        // a relative score mod's terms for this q-block into the warp's slots, after the products' wait: issued under
        // them (with S^T, dP^T, dK and dV live) the table's consumers spilled 680 bytes
        if constexpr (REL_STAGED)
          stage_rel_terms_t<BQ / 8>(rel_slots, scale, C, t, hc, t.QOFF + q0 - (kv_row0 + 16 * p.wq) - 15, p.lane);
#endif

        // P^T into st, dS^T into dp
        gs.bins = grad_sites_lane_bins(sm.bins(cw, n & 1), p.lane, p.wq);
        GradSites* const sites = kGradSites > 0 ? &gs : nullptr;
        probs_t_for<true, REL_WALK, REL_STAGED>(masked, bounds, as_frags(st), as_frags(dp), scale, C, hc, cc, kv0, q0, t,
                                                lse2, p.tig, delta, sites, rel_base);
        pack_a_frags<Elem, BQ>(st, pa);
        pack_a_frags<Elem, BQ>(dp, da);
        store_ds(ds, da, cw * 64 + p.r0, p.tig);

        // dV += P^T dO, dK += dS^T Q
        wgmma_fence();
        wgmma_rs_mnmajor<Elem, D, KSTEPS_Q>(dv, pa, make_smem_desc_sw128(sm.dout(stage), Q_BLOCK_BYTES, 1024));
        wgmma_rs_mnmajor<Elem, D, KSTEPS_Q>(dk, da, make_smem_desc_sw128(sm.q(stage), Q_BLOCK_BYTES, 1024));
        wgmma_commit();
      }

      // dQ = dS K once the dS^T rows it reads are written (generic stores, read by wgmma: the async proxy)
      fence_proxy_async_smem();
      if (DQ_SPLIT_D) named_bar_sync(BAR_DS, 128 * NUM_CONSUMERS);
      else named_bar_sync(BAR_DS + cw, 128);
      float dq[NDQ];
      wgmma_fence();
      // DQ_T: dQ^T = K^T dS^T, a k16 step 16 rows of K (2048 bytes) and of dS^T (32-byte rows: 512)
      const uint64_t desc_ds = DS_SW32 ? make_smem_desc_sw32(ds, DS_T_LBO, 256)
                                       : make_smem_desc_sw128(ds + dq_ds_off, 1024, 1024);
      wgmma_ss_mnmajor<Elem, DQ_T ? BQ : DQ_N, DQ_KSTEPS, 2048, DS_SW32 ? 512 : 2048>(dq, DQ_T ? desc_kt : desc_ds,
                                                                                      DQ_T ? desc_ds : desc_kt);
      wgmma_commit();
      // the tile's gradient sums out under the products (every thread of the consumer has added its elements)
      if (kGradSites > 0) {
        grad_sites_flush_tile(gs, C, hc, t.QOFF + q0, min(kv0, t.KVLEN - 1), p.lane);
        if (kGradDiagSites > 0) grad_sites_flush_bins(gs, sm.bins(cw, n & 1), C, hc, t.QOFF + q0, kv_row0, p.tid);
      }
      // Q, dO and the statistics of this slot are read once every product is done: each thread releases it, so
      // that compute-sanitizer's racecheck sees every read of the statistics ordered before the bulk copy that
      // refills the slot (it does not follow a __syncwarp then one lane's arrival: scripts/racecheck_bulk_probe.cu)
      if constexpr (S_AHEAD == 2) {
        wgmma_wait<1>();  // dV and dK (dQ's product runs on): the slot is free
      } else {
        wgmma_wait<0>();
        fence_regs(dq);
      }
      fence_regs(dv);
      fence_regs(dk);
      fence_regs(pa);
      fence_regs(da);
      mbar_arrive(sm.empty(stage));
      // this step's dQ tile ((b * Hq + h) * q-blocks + i), for its writer
      auto dq_tile_of = [&](const QStep& q) { return ((long long)c.b * a.Hq + q.h) * ((t.QLEN + BQ - 1) / BQ) + q.i; };
      long long dq_tile_ahead = 0;  // S_AHEAD: named before s moves on
      if constexpr (S_AHEAD != 0) {  // the walk's next step, its S^T issued to run under this step's dQ
        dq_tile_ahead = dq_tile_of(s);
        s = following_q_tile(a, c, s);
        const int next_stage = (int)((n + 1) % STAGES);
        const bool more = s.h < c.h_end;
        if (more) mbar_wait(sm.full(next_stage), ((n + 1) / STAGES) & 1u);
        // issued whether or not the walk goes on (ptxas serializes every wgmma of the kernel around one issued
        // conditionally here): at the walk's end, on K's own rows, which nothing writes until the walk is over, and
        // discarded
        wgmma_fence();
        issue_scores_t(st, desc_k, more ? sm.q(next_stage) : sm.k());
        wgmma_commit();
        if constexpr (S_AHEAD == 2) {
          wgmma_wait<1>();  // dQ's product (S^T's runs on)
          fence_regs(dq);
        }
      }
      mbar_wait(sm.dq_empty(cw), (n & 1u) ^ 1u);  // the writer's last reduction has read the buffer
      stage_dq(sm.dq(cw), dq, p.tid);
      if (p.tid == 0) {
        sm.dq_tile(cw)[0] = S_AHEAD ? dq_tile_ahead : dq_tile_of(s);
        if (a.dq_semaphore != nullptr) sm.turn(cw)[1] = sm.turn(cw)[0];
      }
      fence_proxy_async_smem();  // generic stores, read by the bulk reduction (the async proxy)
      __syncwarp();
      if (p.lane == 0) mbar_arrive(sm.dq_full(cw));
      if constexpr (S_AHEAD) {
        wgmma_wait<0>();
        fence_regs(st);
      }
    }
    // every product of the walk has been waited for: K and V are free for the next tile's loads, which run under
    // these stores
    mbar_arrive(sm.kv_empty());
    // the fields again from the slot (the loader names the next tile in the other), so that none is held across the
    // walk for the stores
    const BwdCta e = take_tile(a, sm.tile(turn));
    const Place pe = place_here();
    if constexpr (DKV_STAGED) {
      stage_kv_grads(a, tm_dk, tm_dv, sm, e, cw, pe.tid, (n & 1u) ^ 1u, dk, dv);
      staged = true;
    } else {
      const int kv_row = e.j * BK + cw * 64 + pe.r0;
      store_kv_grad(a.dk, a.dk_stride, e.b, e.kvh, kv_row, a.Lk, dk, scale, pe.tig);
      store_kv_grad(a.dv, a.dv_stride, e.b, e.kvh, kv_row, a.Lk, dv, 1.f, pe.tig);
    }
  }
  if (DKV_STAGED && place_here().tid == 0) bulk_wait_all();  // the last tile's stores complete before the CTA exits
  // the walks are over: once the writer has taken the last staged dQ, it stops (WAIT_NS: dq_done, then dq_full woken
  // with no dQ staged, the one barrier it waits on; the slot is not written, so nothing of it races the writer's read)
  mbar_wait(sm.dq_empty(cw), (n & 1u) ^ 1u);
  // at 80 q rows the place is read again here too: held across the walks, the lane was the one register spilled
  // (elsewhere it stays as it was, the kernels' SASS as measured; read again there, it moved spills onto other rungs:
  // session 37)
  const int end_lane = (BQ == 80 ? place_now() : place_here()).lane;
  if (end_lane == 0) mbar_arrive(sm.dq_done(cw));
  if (WAIT_NS != 0 && end_lane == 0) mbar_arrive(sm.dq_full(cw));
}

__global__ void __launch_bounds__(NTHREADS, 1)
    attngen_bwd_kernel(const __grid_constant__ AttngenBwdArgs a, const __grid_constant__ CUtensorMap tm_q,
                       const __grid_constant__ CUtensorMap tm_do, const __grid_constant__ CUtensorMap tm_k,
                       const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_dk,
                       const __grid_constant__ CUtensorMap tm_dv) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The runtime only promises 16-byte alignment of dynamic shared memory: align by hand.
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const BwdSmem sm{base, smem_raw + (base - raw)};
  if (threadIdx.x == 0) {
    mbar_init(sm.bar_kv(), 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(sm.full(s), 1);                       // the producer's arrive.expect_tx (+ the copies' bytes)
      mbar_init(sm.empty(s), 128 * NUM_CONSUMERS);    // one arrival per consumer thread
    }
    for (int cw = 0; cw < NUM_CONSUMERS; ++cw) {
      mbar_init(sm.dq_full(cw), 4);   // one arrival per warp of the consumer
      mbar_init(sm.dq_empty(cw), 1);  // its writer's lane 0
      mbar_init(sm.dq_done(cw), 4);   // the consumer's warps, once
    }
    mbar_init(sm.kv_empty(), 128 * NUM_CONSUMERS + 1);  // every consumer thread and lane 0 of the producer warp, per tile
    mbar_init(sm.tile_full(), 1);                   // the tile loader, once per work tile
    mbar_fence_init();
  }
  pdl_launch_dependents<PDL>();
  pdl_wait<PDL>();  // the preprocess's delta, lse and flags (PDL: launched while it drains)
  __syncthreads();

  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
  if (wg == 0) {
    setmaxnreg_dec<PRODUCER_REGS>();
    const int warp = __shfl_sync(0xffffffffu, (int)threadIdx.x / 32, 0);
    if (warp >= 1 && warp <= NUM_CONSUMERS) {
      write_dq(a, sm, warp - 1, (int)threadIdx.x & 31);
      return;
    }
    if (warp == 0) produce(a, tm_q, tm_do, sm, (int)threadIdx.x & 31);
    else if (threadIdx.x == 32 * (NUM_CONSUMERS + 1)) load_kv_tiles(a, tm_k, tm_v, sm);
    return;
  }
  setmaxnreg_inc<CONSUMER_REGS>();
  consume(a, &tm_dk, &tm_dv, sm, wg);
}

// ------------------------------------------------------------------------------------------- host side

AttngenKernelInfo bwd_kernel_info() {
  return {ATTNGEN_BWD_ABI_VERSION, (int)sizeof(AttngenBwdArgs), D, kDtypeCode, BQ, BK, NTHREADS, SMEM_BYTES, kArch};
}

int launch_bwd(const AttngenBwdArgs& call, cudaStream_t stream) {
  AttngenBwdArgs a = call;
  // then the preprocess zeroes dQ_acc
  if (DQ_INIT == 0 || a.dq_semaphore != nullptr) a.dq_written = nullptr;
  int dev = 0, sms = 0;
  const cudaError_t err = prepare_device(attngen_bwd_kernel, SMEM_BYTES, dev, sms);  // before the driver calls
  if (err != cudaSuccess) return (int)err;
  if (tma_encode_fn() == nullptr) return ATTNGEN_ERROR_SM90_NO_TMA_ENCODER;
  // Q / dO boxes of BQ rows, K / V boxes of BK rows; each map re-encoded only when its tensor changed.
  static thread_local TmaMapMemo memo_q, memo_do, memo_k, memo_v;
  CUtensorMap tm_q, tm_do, tm_k, tm_v;
  if (tma_encode_bhld_memo(memo_q, &tm_q, a.q, kDtypeCode, D, a.B, a.Hq, a.Lq, a.q_stride, BQ) != CUDA_SUCCESS ||
      tma_encode_bhld_memo(memo_do, &tm_do, a.dout, kDtypeCode, D, a.B, a.Hq, a.Lq, a.do_stride, BQ) != CUDA_SUCCESS ||
      tma_encode_bhld_memo(memo_k, &tm_k, a.k, kDtypeCode, D, a.B, a.Hkv, a.Lk, a.k_stride, BK) != CUDA_SUCCESS ||
      tma_encode_bhld_memo(memo_v, &tm_v, a.v, kDtypeCode, D, a.B, a.Hkv, a.Lk, a.v_stride, BK) != CUDA_SUCCESS)
    return ATTNGEN_ERROR_SM90_TMA_LAYOUT;
  CUtensorMap tm_dk = {}, tm_dv = {};  // DKV_STAGED: boxes of one consumer's 64 kv rows
  if constexpr (DKV_STAGED) {
    static thread_local TmaMapMemo memo_dk, memo_dv;
    if (tma_encode_bhld_memo(memo_dk, &tm_dk, a.dk, kDtypeCode, D, a.B, a.Hkv, a.Lk, a.dk_stride, 64) != CUDA_SUCCESS ||
        tma_encode_bhld_memo(memo_dv, &tm_dv, a.dv, kDtypeCode, D, a.B, a.Hkv, a.Lk, a.dv_stride, 64) != CUDA_SUCCESS)
      return ATTNGEN_ERROR_SM90_TMA_LAYOUT;
  }
  cudaError_t rc = launch_bwd_pre<OrderSection>(a, BQ, stream, PDL, ordered_walks(a) ? order_sections(a) : 0);
  const int ntiles = num_work_tiles(a);
  if (rc == cudaSuccess && ntiles > 0) {
    const int grid = persistent_walks(a) ? min(ntiles, sms) : ntiles;
    rc = launch_kernel(PDL, attngen_bwd_kernel, dim3(grid), dim3(NTHREADS), SMEM_BYTES, stream, a, tm_q, tm_do, tm_k,
                       tm_v, tm_dk, tm_dv);
  }
  const long long qblocks = (long long)a.B * a.Hq * ((a.Lq + BQ - 1) / BQ);
  if (rc == cudaSuccess && qblocks > 0)
    rc = launch_kernel(PDL, attngen_bwd_post_tiled_kernel, dim3((unsigned)qblocks), dim3(POST_THREADS), 0, stream, a);
  return (int)rc;
}

}  // namespace
