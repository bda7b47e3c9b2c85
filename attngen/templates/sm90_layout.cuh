// sm90_layout.cuh: the static facts of the sm90 kernel (fwd_sm90.cuh) that follow from its configuration:
// warpgroup roles and register budgets, accumulator sizes, the shared-memory layout with its mbarriers,
// and the checks that the configuration fits the hardware. Configuration (Elem, D, BQ, BK, STAGES) from
// the including attngen_fwd.cu.
#pragma once

#include "attngen_common.cuh"
#include "score_mask.cuh"  // ATTNGEN_SCORE_REL*'s defaults for variant.inc files without them
#include "sm90_scheduler.cuh"  // TileMailbox

namespace {

using namespace attngen;

constexpr int NUM_CONSUMERS = 2;
constexpr int NTHREADS = 128 * (1 + NUM_CONSUMERS);
// setmaxnreg budgets: 128 * 24 + 256 * 240 = 64512 = 384 * 168, the registers the CTA holds at entry under
// __launch_bounds__(384, 1): the producer hands back (168 - 24) * 128 = 18432, exactly what the consumers take
// ((240 - 168) * 256); setmaxnreg.inc takes nothing beyond what was handed back.
constexpr int PRODUCER_REGS = 24;
constexpr int CONSUMER_REGS = 240;

constexpr int MT = 1;                            // m16 row slices per consumer thread (score_mask.cuh)
// FP8 (e4m3) inputs: 128 columns to a 128-byte row, k32 wgmma steps, V stored transposed (V^T: D rows of BK kv
// columns, K-major for P V, as 8-bit wgmma takes no transposed operand); bfloat16 output. A V^T tile is BK / VT_COLS
// column blocks of D rows x VT_COLS bytes: 128-byte swizzle rows where BK is a multiple of 128, 64-byte ones
// otherwise (BK = 192, FlashAttention-3's FP8 width, is three).
constexpr bool FP8 = sizeof(Elem) == 1;
constexpr int VT_COLS = BK % 128 == 0 ? 128 : 64;
constexpr int VT_BLOCK_BYTES = D * VT_COLS;
// FP8's P = 2^(c (s - m) + P_OFFSET) before rounding to e4m3 (online_softmax, softmax.cuh), at most 2^8 whatever the
// rescale threshold: at threshold 0 the row max weighs exactly 256, where a kept stale max (threshold 8) would round
// the weight that dominates a peaked row.
constexpr int P_OFFSET = FP8 ? 8 - (int)RESCALE_THRESHOLD : 0;
constexpr int ROW_ELEMS = 128 / (int)sizeof(Elem);  // columns of one 128-byte swizzle row
constexpr int DB = D / ROW_ELEMS;                // 128-byte blocks of a Q / K row
constexpr int Q_BLOCK_BYTES = BQ * 128;          // one 128-byte column block of the Q tile: BQ rows x 128 B
constexpr int Q_BYTES = DB * Q_BLOCK_BYTES;
constexpr int KV_BLOCK_BYTES = BK * 128;
constexpr int KV_BYTES = DB * KV_BLOCK_BYTES;    // one K (or V, or FP8's V^T: D rows x BK bytes) tile
constexpr int NS = BK / 2;                       // S accumulator floats per thread (64 x BK per warpgroup)
constexpr int NO = D / 2;                        // O accumulator floats per thread (64 x D per warpgroup)
constexpr int KSTEP_BYTES = 32;                  // the k extent of one wgmma: k16 of 16-bit, k32 of 8-bit elements
constexpr int KSTEPS_QK = D * (int)sizeof(Elem) / KSTEP_BYTES;   // k steps of Q K^T
constexpr int KSTEPS_PV = BK * (int)sizeof(Elem) / KSTEP_BYTES;  // k steps of P V

// Shared memory (offsets from a 1024-byte aligned base; every tile is a multiple of 1024 bytes, so every
// 8-row swizzle atom is aligned as the descriptors' base offset 0 requires):
//   Q [QBUFS][DB][BQ][128 B] | K [STAGES][DB][BK][128 B] | V [STAGES][DB][BK][128 B] | relative terms | mbarriers
//   | tile id | work-tile order (fwd_sm90.cuh ascending_order)
// (FP8's V^T in the V slots: [STAGES][BK / VT_COLS][D][VT_COLS B].)
// A relative score mod whose b is not linear in d (REL_STAGE) has each consumer warp stage its tile's BK + 15
// diagonals' terms in REL_SLOTS slots of its own (score_mask.cuh, stage_rel_terms), where they fit
// beside the tiles with one Q buffer; elsewhere each thread walks its own diagonals.
// A persistent CTA double-buffers Q where it fits, so that the next work tile's Q loads under this one's
// last kv tiles instead of after its last Q K^T (docs/performance.md).
constexpr int SMEM_LIMIT = 232448;               // 227 KB opt-in maximum per block on sm90
constexpr int REL_SLOTS = BK + 15;
constexpr int REL_WARP_BYTES = (REL_SLOTS * REL_SLOT_BYTES + 15) / 16 * 16;
constexpr int REL_BYTES_WANTED = REL_STAGE && ATTNGEN_REL_STAGEABLE ? 4 * NUM_CONSUMERS * REL_WARP_BYTES : 0;
constexpr int smem_bytes_for(int qbufs, int rel_bytes) {
  return 1024 /* alignment slack */ + qbufs * Q_BYTES + 2 * STAGES * KV_BYTES + rel_bytes +
         (2 * qbufs + 4 * STAGES + 2) * 8 + 8;
}
constexpr int REL_BYTES = smem_bytes_for(1, REL_BYTES_WANTED) <= SMEM_LIMIT ? REL_BYTES_WANTED : 0;
constexpr bool REL_STAGED = REL_BYTES > 0;
constexpr int QBUFS = PERSISTENT && smem_bytes_for(2, REL_BYTES) <= SMEM_LIMIT ? 2 : 1;
constexpr int OFF_K = QBUFS * Q_BYTES;
constexpr int OFF_V = OFF_K + STAGES * KV_BYTES;
constexpr int OFF_REL = OFF_V + STAGES * KV_BYTES;
constexpr int OFF_BAR = OFF_REL + REL_BYTES;
// Q full, Q empty per Q buffer; K full, V full, K empty, V empty per stage; tile id full, tile id empty
constexpr int NUM_MBARS = 2 * QBUFS + 4 * STAGES + 2;
constexpr int OFF_TILE_ID = OFF_BAR + NUM_MBARS * 8;
constexpr int SMEM_BYTES = 1024 /* alignment slack */ + OFF_TILE_ID + 8;  // tile id, order
static_assert(SMEM_BYTES == smem_bytes_for(QBUFS, REL_BYTES), "layout and its size formula agree");

constexpr uint32_t BAR_SCHEDULE = 1;  // named barrier (0 is __syncthreads) + consumer index: its turn

static_assert(sizeof(Elem) == 2 || (FP8 && D == 128 && BK % 64 == 0),
              "16-bit inputs, or FP8 at head dim 128 with BK a multiple of 64 (V^T column blocks of 64 or 128 bytes)");
static_assert(attngen_head_dim_supported(D), "head dim: one of ATTNGEN_HEAD_DIMS");
static_assert(BQ == 64 * NUM_CONSUMERS, "each consumer warpgroup owns 64 q rows (wgmma M = 64)");
static_assert(D % 64 == 0 && D <= 256, "head dim: multiple of 64 (128-byte swizzle rows), at most 256 (wgmma N)");
static_assert(BK % 16 == 0 && BK >= 64 && BK <= 192, "BK: multiple of 16 (P V k-steps) in [64, 192] (wgmma_ss N)");
static_assert(BK <= 256 && BQ <= 256, "TMA box rows are at most 256");
static_assert(RESCALE_THRESHOLD >= 0.f, "rescale threshold: log2 units of growth, >= 0");
static_assert(!FP8 || (RESCALE_THRESHOLD <= 8.f && RESCALE_THRESHOLD == (float)(int)RESCALE_THRESHOLD),
              "FP8: a whole rescale threshold of at most 8 (P reaches 2^8; e4m3 tops out at 448)");
static_assert(STAGES >= 2, "the overlapped loop holds two K/V tiles at once");
static_assert(!PIN_SOFTMAX || OVERLAP, "pin_softmax orders the softmax before the P V wait of the overlapped loop");
static_assert(Q_BLOCK_BYTES % 1024 == 0 && KV_BLOCK_BYTES % 1024 == 0 && (!FP8 || VT_BLOCK_BYTES % 1024 == 0),
              "swizzle atoms must stay 1024-aligned");
static_assert(SMEM_BYTES <= SMEM_LIMIT, "tiles do not fit in shared memory: lower BK or STAGES");
static_assert(KV_BYTES < (1 << 20) && Q_BYTES < (1 << 20), "mbarrier transaction counts are 20-bit");
static_assert(KV_BLOCK_BYTES / 16 < (1 << 14), "V descriptor LBO field is 14 bits (of bytes >> 4)");
constexpr int ENTRY_REGS = 65536 / NTHREADS / 8 * 8;  // 168
static_assert(PRODUCER_REGS * 128 + CONSUMER_REGS * 128 * NUM_CONSUMERS <= ENTRY_REGS * NTHREADS,
              "register budget: what the CTA holds at entry");

// Shared-memory addresses of the CTA's buffers and mbarriers.
struct Smem {
  uint32_t base;  // 1024-byte aligned
  __device__ uint32_t q(int qb) const { return base + qb * Q_BYTES; }
  __device__ uint32_t k(int st) const { return base + OFF_K + st * KV_BYTES; }
  __device__ uint32_t v(int st) const { return base + OFF_V + st * KV_BYTES; }
  __device__ uint32_t rel(int warp) const { return base + OFF_REL + warp * REL_WARP_BYTES; }  // consumer warp 0..7
  __device__ uint32_t bar(int n) const { return base + OFF_BAR + 8u * (uint32_t)n; }
  __device__ uint32_t bar_q(int qb) const { return bar(qb); }
  __device__ uint32_t bar_q_empty(int qb) const { return bar(QBUFS + qb); }
  __device__ uint32_t full_k(int st) const { return bar(2 * QBUFS + st); }
  __device__ uint32_t full_v(int st) const { return bar(2 * QBUFS + STAGES + st); }
  __device__ uint32_t empty_k(int st) const { return bar(2 * QBUFS + 2 * STAGES + st); }
  __device__ uint32_t empty_v(int st) const { return bar(2 * QBUFS + 3 * STAGES + st); }
  __device__ uint32_t order() const { return base + OFF_TILE_ID + 4; }  // 1: q-blocks in ascending order
  __device__ TileMailbox mailbox() const {
    return {base + OFF_TILE_ID, bar(2 * QBUFS + 4 * STAGES), bar(2 * QBUFS + 4 * STAGES) + 8u};
  }
};

// The Q buffer of the n-th work tile of this CTA and the parity of that buffer's use.
__device__ __forceinline__ int q_buffer(uint32_t n) { return QBUFS == 2 ? (int)(n & 1u) : 0; }
__device__ __forceinline__ uint32_t q_parity(uint32_t n) { return QBUFS == 2 ? (n >> 1) & 1u : n & 1u; }

// The next slot of the K/V ring (stage) and the parity of its use (phase; see sm90_mbarrier.cuh).
__device__ __forceinline__ void advance(int& stage, uint32_t& phase) {
  if (++stage == STAGES) {
    stage = 0;
    phase ^= 1u;
  }
}

}  // namespace
