// decode_layout.cuh: the static facts of the KV-cache kernel (fwd_decode.cuh) that follow from its configuration:
// warps and their share of a K/V tile, the mma steps, the packed query rows, the shared-memory layout (the padded Q
// rows and the swizzled K/V ring, which the warps' softmax states reuse to merge) and the checks that the
// configuration fits. Configuration (Elem, D, BQ, BK, NWARPS, STAGES, PDL, kArch) from the including attngen_fwd.cu.
#pragma once

#include "attngen_common.cuh"
#include "sm80_tiles.cuh"  // PaddedRows

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

}  // namespace
