// sm90_bwd_layout.cuh: the static facts of the sm90 backward kernel (bwd_sm90.cuh) that follow from its
// configuration: warpgroup roles (producer thread, dQ writer warps, consumers) and register budgets, accumulator
// sizes, how dQ is split between the consumers and where it goes, the shared-memory layout with its mbarriers,
// and the checks that the configuration fits.
// Configuration (Elem, D, BQ, BK, STAGES, PRODUCER_REGS, CONSUMER_REGS) from the including attngen_bwd.cu.
#pragma once

#include "attngen_common.cuh"
#include "score_mask.cuh"      // ATTNGEN_SCORE_REL*'s defaults for variant.inc files without them
#include "bwd_grad_sites.cuh"  // kGradDiagSites, GRAD_BINS
#include "bwd_probs.cuh"       // REL_SLOT_BYTES_T

namespace {

using namespace attngen;

constexpr int NUM_CONSUMERS = BK / 64;  // each consumer warpgroup owns 64 kv rows (wgmma M = 64)
constexpr int NTHREADS = 128 * (1 + NUM_CONSUMERS);
// setmaxnreg budgets (PRODUCER_REGS, CONSUMER_REGS: the tile configuration's), as in the forward
// (sm90_layout.cuh): 128 * 24 + 256 * 240 = 64512 = 384 * 168 by default; the build tries 56 / 224 when that
// spills (jit/tiles.py sm90_bwd_ladder).

constexpr int DB = D / 64;                     // 128-byte (64-column) blocks of a row
constexpr int Q_BLOCK_BYTES = BQ * 128;        // one 64-column block of a Q (or dO) tile
constexpr int Q_BYTES = DB * Q_BLOCK_BYTES;
constexpr int KV_BLOCK_BYTES = BK * 128;
constexpr int KV_BYTES = DB * KV_BLOCK_BYTES;  // the K (or V) tile
constexpr int DS_BYTES = BK * BQ * 2;          // dS^T: BK kv rows of BQ q columns (DS_SW32 below)
constexpr int STATS_BYTES = 2 * BQ * 4;        // lse_log2 then delta of one q-block
constexpr int NS = BQ / 2;                     // S^T (and dP^T) accumulator floats per thread: 64 x BQ
constexpr int NKV = D / 2;                     // dK (and dV) accumulator floats per thread: 64 x D
constexpr int KSTEPS_D = D / 16;               // k16 steps of K Q^T and V dO^T
constexpr int KSTEPS_Q = BQ / 16;              // k16 steps of P^T dO and dS^T Q

// dQ = dS K (64 q rows, M = 64), or at BQ = 80, which is no multiple of wgmma's M, dQ^T = K^T dS^T (DQ_T: M = the
// consumer's 64 columns of dQ, N = BQ; FA3's dQ_swapAB). From D = 128 on, each consumer takes D / NUM_CONSUMERS
// whole 64-column blocks of dQ over all BK kv rows (each element added once); at D = 64 a 32-column half would start
// inside a 128-byte swizzle row, so each consumer takes all D columns over its own 64 kv rows, and both add into
// dQ_acc.
constexpr bool DQ_SPLIT_D = (D / NUM_CONSUMERS) % 64 == 0;
constexpr int DQ_N = DQ_SPLIT_D ? D / NUM_CONSUMERS : D;
constexpr int DQ_KSTEPS = DQ_SPLIT_D ? BK / 16 : 64 / 16;
constexpr bool DQ_T = BQ % 64 != 0;
constexpr int NDQ = DQ_T ? BQ / 2 : DQ_N / 2;  // floats per thread of the 64 x DQ_N (DQ_T: DQ_N x BQ) accumulator

// dS^T in shared memory, BK kv rows of BQ q columns: at BQ = 64 one 128-byte swizzled row per kv row (the MN-major
// A of dQ = dS K); at BQ = 80 the MN-major B of dQ^T in 32-byte swizzle atoms (160-byte rows: no wider swizzle
// divides them), BQ / 16 column blocks of BK rows x 32 bytes, DS_T_LBO apart (sm90_wgmma.cuh make_smem_desc_sw32).
constexpr bool DS_SW32 = DQ_T;
constexpr int DS_T_LBO = BK * 32;

// dQ's path to the fp32 dQ_acc: each consumer stages its BQ x DQ_N tile and a writer warp adds it with one bulk
// reduction (per-thread reductions queue on the load/store unit). dQ_acc is tiled: q-block i of head (b, h) is
// BQ * D contiguous floats at ((b * Hq + h) * Lq_pad + i * BQ) * D, in which chunk c (a consumer's DQ_N columns;
// 0 at D = 64) is BQ * DQ_N floats in the accumulator's thread order, [NDQ / 4][128 threads][4]: float4 v of
// thread t holds rows r, r + 8 (r = 16 (t / 32) + t % 32 / 4) at columns c DQ_N + 8 v + 2 (t % 4) + {0, 1}; with
// DQ_T, rows and columns of dQ^T: dQ rows 8 v + 2 (t % 4) + {0, 1} at columns c DQ_N + r, r + 8 (dq_tile_offset).
constexpr int DQ_STAGE_BYTES = BQ * DQ_N * 4;  // one consumer's staged dQ
constexpr int DQ_CHUNK = DQ_SPLIT_D ? 1 : 0;   // the chunk of consumer cw is DQ_CHUNK * cw

// Shared memory (offsets from a 1024-byte aligned base; tiles are multiples of 1024 bytes, so every 8-row
// swizzle atom is 1024-aligned as the descriptors' base offset 0 requires):
//   K | V | Q [STAGES] | dO [STAGES] | dS^T [2] | row statistics [STAGES] | gradient bins | relative terms | turns
//   | work-tile slots [2] | mbarriers | staged dQ [NUM_CONSUMERS]
// dS^T is double-buffered so that one consumer may write the next q-block's while the other still reads
// this one's in dQ = dS K. The gradient bins (bwd_grad_sites.cuh; none without diagonal sites) are too, per
// consumer: a tile's bins are emptied after the barrier that follows it, the next tile fills the other ones.
// The relative terms (REL_STAGED: the relative walk of a score mod whose b is not linear in d, REL_STAGE, where
// they fit): each consumer warp's BQ + 15 diagonals (bwd_probs.cuh, stage_rel_terms_t).
constexpr int SMEM_LIMIT = 232448;  // 227 KB opt-in maximum per block on sm90
constexpr int OFF_V = KV_BYTES;
constexpr int OFF_Q = 2 * KV_BYTES;
constexpr int OFF_DO = OFF_Q + STAGES * Q_BYTES;
constexpr int OFF_DS = OFF_DO + STAGES * Q_BYTES;
constexpr int OFF_STATS = OFF_DS + 2 * DS_BYTES;
constexpr int OFF_BINS = OFF_STATS + STAGES * STATS_BYTES;
constexpr int BINS_BYTES = kGradDiagSites * GRAD_SITE_FLOATS * 4;  // one consumer's bins of one tile
constexpr int OFF_REL = OFF_BINS + NUM_CONSUMERS * 2 * BINS_BYTES;
constexpr int REL_SLOTS = BQ + 15;
constexpr int REL_WARP_BYTES = (REL_SLOTS * REL_SLOT_BYTES_T + 15) / 16 * 16;
// K and V loaded; per stage: Q, dO, statistics loaded / released; per consumer: its staged dQ written / read, its
// walk over; K and V read for the last time in a work tile; the work tile named
constexpr int NUM_MBARS = 1 + 2 * STAGES + 3 * NUM_CONSUMERS + 2;
// The staged dQ is 128-byte aligned for the bulk reductions; with DKV_STAGED it also holds dV at head dim 128, as
// 128-byte swizzled boxes for a TMA store: 1024-byte aligned.
constexpr int DQ_ALIGN = DKV_STAGED ? 1024 : 128;
constexpr int smem_bytes_for(int rel_bytes) {
  return 1024 /* alignment slack */ +
         (OFF_REL + rel_bytes + 16 * NUM_CONSUMERS + 64 + NUM_MBARS * 8 + DQ_ALIGN - 1) / DQ_ALIGN * DQ_ALIGN +
         NUM_CONSUMERS * DQ_STAGE_BYTES;
}
constexpr int REL_BYTES_WANTED = REL_WALK && REL_STAGE && ATTNGEN_REL_STAGEABLE ? 4 * NUM_CONSUMERS * REL_WARP_BYTES : 0;
constexpr int REL_BYTES = smem_bytes_for(REL_BYTES_WANTED) <= SMEM_LIMIT ? REL_BYTES_WANTED : 0;
constexpr bool REL_STAGED = REL_BYTES > 0;
constexpr int OFF_TURN = OFF_REL + REL_BYTES;  // each consumer's turn and dQ slot (16 B)
constexpr int OFF_TILE = OFF_TURN + 16 * NUM_CONSUMERS;  // the work tile of the CTA's even / odd turns (8 ints each)
constexpr int OFF_BAR = OFF_TILE + 64;
constexpr int OFF_DQ = (OFF_BAR + NUM_MBARS * 8 + DQ_ALIGN - 1) / DQ_ALIGN * DQ_ALIGN;  // the consumers' staged dQ
constexpr int SMEM_BYTES = 1024 /* alignment slack */ + OFF_DQ + NUM_CONSUMERS * DQ_STAGE_BYTES;
static_assert(SMEM_BYTES == smem_bytes_for(REL_BYTES), "layout and its size formula agree");

constexpr uint32_t BAR_DS = 1;  // named barrier (0 is __syncthreads): dS^T written (+ consumer index at D = 64)
constexpr uint32_t BAR_BINS = 3;  // + consumer index: the gradient bins zeroed before the first tile
constexpr uint32_t BAR_WALKS_DONE = 5;  // DKV_STAGED: both consumers' walks over (every dS^T read)
constexpr uint32_t BAR_DKV = 6;  // + consumer index: DKV_STAGED's dK, dV staged, or their stores' reads done

static_assert(sizeof(Elem) == 2, "16-bit inputs only");
static_assert(attngen_head_dim_supported(D), "head dim: one of ATTNGEN_HEAD_DIMS");
static_assert(D % 64 == 0 && D <= 128, "head dim: 64 or 128 (256 takes the sm80 backward: dK + dV do not fit)");
static_assert(BQ == 64 || (BQ == 80 && DQ_SPLIT_D && DQ_N == 64 && !DKV_STAGED),
              "BQ: 64, or 80 at head dim 128 (dQ^T's M is a consumer's 64 columns; dK is staged in 128-byte rows)");
static_assert(NUM_CONSUMERS == 2 && BK == 64 * NUM_CONSUMERS, "two consumer warpgroups of 64 kv rows");
static_assert(STAGES >= 2, "Q / dO of the next q-block load under this one");
static_assert(DQ_SPLIT_D || D == 64, "dQ split by columns, or by kv rows at D = 64");
static_assert(STATS_BYTES % 16 == 0 && (BQ * 4) % 16 == 0, "bulk copies move multiples of 16 bytes");
static_assert(OFF_STATS % 16 == 0 && OFF_TURN % 8 == 0 && OFF_TILE % 8 == 0 && OFF_BAR % 8 == 0,
              "alignment of the statistics, the slots and the mbarriers");
static_assert(OFF_DQ % 16 == 0 && DQ_STAGE_BYTES % 16 == 0, "bulk reductions read 16-byte aligned sources");
static_assert(!DKV_STAGED || (OFF_DS % 1024 == 0 && OFF_DQ % 1024 == 0 && DQ_STAGE_BYTES >= 64 * D * 2),
              "DKV_STAGED: 1024-aligned boxes of 64 kv rows in the dS^T buffers and the staged dQ");
static_assert(GRAD_ROWS == 64 && (kGradDiagSites == 0 || GRAD_ROWS + BQ - 1 <= GRAD_BINS),
              "a diagonal bin per diagonal of a consumer's tile");
static_assert(Q_BYTES % 1024 == 0 && KV_BYTES % 1024 == 0 && DS_BYTES % 1024 == 0, "1024-aligned swizzle atoms");
static_assert(SMEM_BYTES <= SMEM_LIMIT,
              "tiles do not fit in shared memory: lower STAGES (or codegen.GRAD_DIAG_SITES, whose bins take room)");
static_assert(2 * KV_BYTES < (1 << 20) && 2 * Q_BYTES + STATS_BYTES < (1 << 20), "mbarrier tx counts are 20-bit");
// setmaxnreg.inc takes registers only from those the CTA's setmaxnreg.dec handed back (a shortfall blocks the
// consumers for good): the budgets must fit what the CTA holds at entry, 168 per thread under
// __launch_bounds__(384, 1).
constexpr int ENTRY_REGS = 65536 / NTHREADS / 8 * 8;
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NUM_CONSUMERS <= ENTRY_REGS * NTHREADS, "register budget");
static_assert(PRODUCER_REGS % 8 == 0 && CONSUMER_REGS % 8 == 0 && PRODUCER_REGS >= 24 && CONSUMER_REGS <= 256,
              "setmaxnreg counts: multiples of 8 in [24, 256]");

// Shared-memory addresses (32-bit, for TMA / wgmma / mbarriers) and the generic pointer of the same base.
struct BwdSmem {
  uint32_t base;        // 1024-byte aligned
  unsigned char* ptr;   // the same bytes, generic
  __device__ uint32_t k() const { return base; }
  __device__ uint32_t v() const { return base + OFF_V; }
  __device__ uint32_t q(int st) const { return base + OFF_Q + st * Q_BYTES; }
  __device__ uint32_t dout(int st) const { return base + OFF_DO + st * Q_BYTES; }
  __device__ uint32_t ds(int buf) const { return base + OFF_DS + buf * DS_BYTES; }
  __device__ uint32_t stats(int st) const { return base + OFF_STATS + st * STATS_BYTES; }
  __device__ const float* stats_ptr(int st) const {
    return reinterpret_cast<const float*>(ptr + OFF_STATS + st * STATS_BYTES);
  }
  __device__ uint32_t bins(int consumer, int buf) const {
    return base + OFF_BINS + (uint32_t)((consumer * 2 + buf) * BINS_BYTES);
  }
  __device__ uint32_t dq(int consumer) const { return base + OFF_DQ + (uint32_t)(consumer * DQ_STAGE_BYTES); }
  __device__ uint32_t rel(int warp) const { return base + OFF_REL + (uint32_t)(warp * REL_WARP_BYTES); }  // 0..7
  // a consumer's 16 bytes: int [0] its deterministic turn for the q-block in hand; for its dQ writer, int [1] the
  // staged dQ's turn and long long [1] its tile ((b * Hq + h) * q-blocks + i)
  __device__ int* turn(int consumer) const { return reinterpret_cast<int*>(ptr + OFF_TURN) + 4 * consumer; }
  __device__ uint32_t slot(int consumer) const { return base + OFF_TURN + 16u * (uint32_t)consumer; }
  __device__ long long* dq_tile(int consumer) const {
    return reinterpret_cast<long long*>(ptr + OFF_TURN) + 2 * consumer + 1;
  }
  // the work tile of the CTA's n-th turn (n % 2), set by the tile loader before it arrives on tile_full
  __device__ int* tile(uint32_t n) const { return reinterpret_cast<int*>(ptr + OFF_TILE) + 8 * (n & 1u); }
  __device__ uint32_t bar(int n) const { return base + OFF_BAR + 8u * (uint32_t)n; }
  __device__ uint32_t bar_kv() const { return bar(0); }
  __device__ uint32_t full(int st) const { return bar(1 + st); }
  __device__ uint32_t empty(int st) const { return bar(1 + STAGES + st); }
  __device__ uint32_t dq_full(int consumer) const { return bar(1 + 2 * STAGES + consumer); }
  __device__ uint32_t dq_empty(int consumer) const { return bar(1 + 2 * STAGES + NUM_CONSUMERS + consumer); }
  __device__ uint32_t dq_done(int consumer) const { return bar(1 + 2 * STAGES + 2 * NUM_CONSUMERS + consumer); }
  __device__ uint32_t kv_empty() const { return bar(1 + 2 * STAGES + 3 * NUM_CONSUMERS); }
  __device__ uint32_t tile_full() const { return bar(2 + 2 * STAGES + 3 * NUM_CONSUMERS); }
};

// Float offset in a tiled dQ_acc q-block of the element at tile row r (< BQ), column col.
__host__ __device__ constexpr int dq_tile_offset(int r, int col) {
  const int c = DQ_SPLIT_D ? col / DQ_N : 0, cl = col - c * DQ_N;
  const int m = DQ_T ? cl : r, n = DQ_T ? r : cl;  // the accumulator's row and column
  const int t = (m / 16) * 32 + (m % 8) * 4 + (n % 8) / 2;
  return c * (DQ_STAGE_BYTES / 4) + ((n / 8) * 128 + t) * 4 + ((m / 8) % 2) * 2 + n % 2;
}

// dq_tile_offset inverts the staging order (bwd_sm90.cuh stage_dq, the writer's chunk offset): float k of float4 v
// of thread t of chunk c, the accumulator's element at row 16 (t / 32) + t % 32 / 4 + 8 (k / 2), column
// 8 v + 2 (t % 4) + k % 2 (dQ's row and column c DQ_N + that; with DQ_T, its column c DQ_N + row and row column),
// lies at c BQ DQ_N + (v 128 + t) 4 + k. Checked whole at build time.
constexpr bool dq_tile_offset_inverts_staging() {
  for (int c = 0; c < (DQ_SPLIT_D ? NUM_CONSUMERS : 1); ++c)
    for (int t = 0; t < 128; ++t)
      for (int v = 0; v < NDQ / 4; ++v)
        for (int k = 0; k < 4; ++k) {
          const int m = 16 * (t / 32) + (t % 32) / 4 + 8 * (k / 2), n = 8 * v + 2 * (t % 4) + k % 2;
          const int r = DQ_T ? n : m, col = c * DQ_N + (DQ_T ? m : n);
          if (dq_tile_offset(r, col) != c * (DQ_STAGE_BYTES / 4) + (v * 128 + t) * 4 + k) return false;
        }
  return true;
}
static_assert(dq_tile_offset_inverts_staging(), "the postprocess reads dQ_acc where the staging did not put it");

// Where float4 f (< BQ * D / 4) of a tiled dQ_acc q-block lies (the staging order above, read back in that order
// by the postprocess, bwd_dq.cuh): x, y at tile row `row`, columns col, col + 1; z, w at row + 8. With DQ_T, x, y at
// rows row, row + 1 of column col; z, w at column col + 8.
struct DqPlace {
  int row, col;
};
__host__ __device__ constexpr DqPlace dq_float4_place(int f) {
  constexpr int CHUNK4 = DQ_STAGE_BYTES / 16;  // float4 of a chunk
  const int c = f / CHUNK4, v = f % CHUNK4 / 128, t = f % 128;
  const int m = 16 * (t / 32) + t % 32 / 4, n = 8 * v + 2 * (t % 4);
  return DQ_T ? DqPlace{n, c * DQ_N + m} : DqPlace{m, c * DQ_N + n};
}

// The tile row and column of float k of float4 f: x, y, z, w as above.
__host__ __device__ constexpr DqPlace dq_float_place(int f, int k) {
  const DqPlace p = dq_float4_place(f);
  const int hi = k / 2, lo = k % 2;
  return DQ_T ? DqPlace{p.row + lo, p.col + 8 * hi} : DqPlace{p.row + 8 * hi, p.col + lo};
}

// dq_float_place agrees with dq_tile_offset on every float of a q-block.
constexpr bool dq_float4_place_matches_offsets() {
  for (int f = 0; f < BQ * D / 4; ++f)
    for (int k = 0; k < 4; ++k) {
      const DqPlace p = dq_float_place(f, k);
      if (p.row >= BQ || p.col >= D || dq_tile_offset(p.row, p.col) != 4 * f + k) return false;
    }
  return true;
}
static_assert(dq_float4_place_matches_offsets(), "the postprocess would put dQ_acc's floats in the wrong places");

}  // namespace
