// fwd_sm80.cuh: attention forward for sm80+ (the portable kernel), FlashAttention-2 style: one CTA per
// (q-block of BQ rows, query head, batch), grid (ceil(Lq/BQ), Hq, B) with the last q-block launched
// first; NWARPS warps, warp w owning rows [w*16*MT, (w+1)*16*MT) of the q tile (MT m16 tiles per
// warp); Q resident in shared memory; K/V tiles of BK rows double-buffered in shared memory with
// cp.async (zero-filled past the sequence ends); S = Q K^T and O += P V on mma.sync m16n8k16 (16-bit
// in, fp32 accumulate; ldmatrix, ldmatrix.trans for V); online softmax in fp32 in the log2 domain; O
// staged through shared memory and written with 16-byte stores.
// Configuration (Elem, D, BQ, BK, NWARPS, MIN_BLOCKS, kDtypeCode, kArch) and variant.inc come from the
// including attngen_fwd.cu (templates/attngen_fwd.cu.j2).
#pragma once

#include "attngen_common.cuh"
#include "sm80_tiles.cuh"
#include "block_range.cuh"
#include "score_mask.cuh"
#include "softmax.cuh"
#include "epilogue.cuh"
#include "host_abi.cuh"

namespace {

using namespace attngen;

constexpr int NTHREADS = NWARPS * 32;
constexpr int MT = BQ / (16 * NWARPS);   // m16 tiles per warp
constexpr int ROWS_PER_WARP = 16 * MT;
constexpr int NT_S = BK / 8;             // n8 tiles of S (kv columns) per m16 tile
constexpr int NT_O = D / 8;              // n8 tiles of O (head-dim columns) per m16 tile
constexpr int KC_QK = D / 16;            // k16 steps of Q K^T
constexpr int KC_PV = BK / 16;           // k16 steps of P V

// Shared memory: Q, then K and V double-buffered, in padded rows (sm80_tiles.cuh).
using Rows = PaddedRows<Elem, D, NTHREADS>;
constexpr int LDS = Rows::LDS;                   // row pitch in elements
constexpr int ROW_BYTES = Rows::ROW_BYTES;
constexpr int Q_TILE = BQ * LDS;                 // elements
constexpr int KV_TILE = BK * LDS;
constexpr int STAGES = 2;
constexpr int SMEM_BYTES = (Q_TILE + 2 * STAGES * KV_TILE) * 2;
constexpr int CHUNKS_PER_ROW = Rows::CHUNKS_PER_ROW;

static_assert(attngen_head_dim_supported(D), "head dim: one of ATTNGEN_HEAD_DIMS");
static_assert(BQ % (16 * NWARPS) == 0 && MT >= 1, "BQ must be a multiple of 16 * NUM_WARPS");
static_assert(BK % 16 == 0, "BK must be a multiple of 16");
static_assert((ROWS_PER_WARP * CHUNKS_PER_ROW) % 32 == 0, "epilogue store assumes whole warp passes");

// O (normalised) -> shared (this warp's own rows of the Q tile, which only this warp reads) -> 16-byte
// global stores. Every copy must be complete first: with zero visited tiles the Q copies may still be
// in flight.
__device__ __forceinline__ void store_o(const float (&o)[MT][NT_O][4], Elem* sO, const AttngenFwdArgs& a, int b,
                                        int h, int i, int QLEN, int warp, int lane, int g, int tig) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int r = warp * ROWS_PER_WARP + mt * 16 + g;
#pragma unroll
    for (int nt = 0; nt < NT_O; ++nt) {
      const int c = nt * 8 + tig * 2;
      *reinterpret_cast<uint32_t*>(sO + r * LDS + c) = pack2<Elem>(o[mt][nt][0], o[mt][nt][1]);
      *reinterpret_cast<uint32_t*>(sO + (r + 8) * LDS + c) = pack2<Elem>(o[mt][nt][2], o[mt][nt][3]);
    }
  }
  __syncwarp();
  Elem* obase = static_cast<Elem*>(a.o) + (long long)b * a.o_stride[0] + (long long)h * a.o_stride[1];
  const long long o_rs = a.o_stride[2];
#pragma unroll
  for (int p = 0; p < ROWS_PER_WARP * CHUNKS_PER_ROW / 32; ++p) {
    const int idx = p * 32 + lane;
    const int r = warp * ROWS_PER_WARP + idx / CHUNKS_PER_ROW;
    const int chunk = idx % CHUNKS_PER_ROW;
    const int row = i * BQ + r;
    if (row < QLEN) {
      const uint4 v = *reinterpret_cast<const uint4*>(sO + r * LDS + chunk * 8);
      st_global_16(obase + (long long)row * o_rs + chunk * 8, v);
    }
  }
}

__global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS) attngen_fwd_kernel(const __grid_constant__ AttngenFwdArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sQ = smem_addr(smem_raw);
  const uint32_t sK = sQ + Q_TILE * 2;                 // [STAGES][BK][LDS]
  const uint32_t sV = sK + STAGES * KV_TILE * 2;       // [STAGES][BK][LDS]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;   // mma groupID: fragment row (and row + 8)
  const int tig = lane & 3;  // thread in group: fragment column pair

  // Later q-blocks see more kv tiles under causal-like masks: launch them first (longest first).
  const int i = (int)gridDim.x - 1 - (int)blockIdx.x;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int QLEN = a.Lq, KVLEN = a.Lk, QOFF = a.q_offset;
  const int kvh = h / (a.Hq / a.Hkv);  // GQA / MQA: consecutive query heads share a kv head

  const CapturedArgs& C = a.captured;
  TileArgs t;
  t.QLEN = QLEN;
  t.KVLEN = KVLEN;
  t.QOFF = QOFF;
  t.b = b;
  t.h = h;

  const Elem* qbase = static_cast<const Elem*>(a.q) + (long long)b * a.q_stride[0] + (long long)h * a.q_stride[1];
  const Elem* kbase = static_cast<const Elem*>(a.k) + (long long)b * a.k_stride[0] + (long long)kvh * a.k_stride[1];
  const Elem* vbase = static_cast<const Elem*>(a.v) + (long long)b * a.v_stride[0] + (long long)kvh * a.v_stride[1];
  const long long q_rs = a.q_stride[2], k_rs = a.k_stride[2], v_rs = a.v_stride[2];

  const KvRange range = kv_range<BQ, BK>(C, t, i);
  const int j_end = range.j_end, f_lo = range.f_lo, f_hi = range.f_hi;
  int j = next_kv_tile<BQ, BK>(C, t, i, range.j_begin, j_end, f_lo, f_hi, range);

  // Prologue: group 0 = Q tile + first K/V tile (stage 0).
  Rows::load<BQ>(sQ, qbase, q_rs, i * BQ, QLEN, tid);
  if (j < j_end) {
    Rows::load<BK>(sK, kbase, k_rs, j * BK, KVLEN, tid);
    Rows::load<BK>(sV, vbase, v_rs, j * BK, KVLEN, tid);
  }
  cp_async_commit();

  // Per-row state. A thread holds rows r(mt, rh) = warp*ROWS_PER_WARP + mt*16 + rh*8 + g of the tile.
  const HeadCtx hc = head_ctx(C, b, h);
  int qi[MT][2];
  RowCtx rc[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int row = i * BQ + warp * ROWS_PER_WARP + mt * 16 + rh * 8 + g;
      // Rows past QLEN are computed (never stored) with the last valid row's index, so mods that load
      // captured tensors at q_idx stay in bounds.
      qi[mt][rh] = min(row, QLEN - 1) + QOFF;
      rc[mt][rh] = row_ctx(C, hc, qi[mt][rh]);
    }
  }

  float o[MT][NT_O][4];
  float m[MT][2];  // running row max of the log2-domain scores (-inf: nothing kept yet)
  float l[MT][2];  // running row sum of 2^(x - m), this thread's columns only (quad-reduced at the end)
  zero(o);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      m[mt][rh] = -INFINITY;
      l[mt][rh] = 0.f;
    }
  }

  // Per-lane ldmatrix offsets (bytes) inside a tile (sm80_tiles.cuh): Q the A operand (this warp's rows), K the
  // B operand, V the B operand read transposed.
  const uint32_t q_lane = lane_a<ROW_BYTES>(lane, warp * ROWS_PER_WARP);
  const uint32_t k_lane = lane_b<ROW_BYTES>(lane);
  const uint32_t v_lane = lane_b_trans<ROW_BYTES>(lane);

  const float scale = a.scale;
  int stage = 0;
  while (j < j_end) {
    const int j_next = next_kv_tile<BQ, BK>(C, t, i, j + 1, j_end, f_lo, f_hi, range);

    // Every warp is done with the other stage (the previous tile) before it is overwritten.
    __syncthreads();
    if (j_next < j_end) {
      const uint32_t off = (uint32_t)((stage ^ 1) * KV_TILE * 2);
      Rows::load<BK>(sK + off, kbase, k_rs, j_next * BK, KVLEN, tid);
      Rows::load<BK>(sV + off, vbase, v_rs, j_next * BK, KVLEN, tid);
    }
    cp_async_commit();   // possibly empty: keeps "all but the newest group" = this tile's data
    cp_async_wait<1>();
    __syncthreads();     // ... and everyone's copies of it visible

    const uint32_t sKs = sK + (uint32_t)(stage * KV_TILE * 2);
    const uint32_t sVs = sV + (uint32_t)(stage * KV_TILE * 2);

    // S = Q K^T
    float s[MT][NT_S][4];
    zero(s);
#pragma unroll
    for (int kc = 0; kc < KC_QK; ++kc) {
      uint32_t qa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(qa[mt], sQ + q_lane + mt * 16 * ROW_BYTES + kc * 32);
#pragma unroll
      for (int np = 0; np < NT_S / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, sKs + k_lane + np * 16 * ROW_BYTES + kc * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
          mma_16816<Elem>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    score_kv_tile</*RAW=*/false, BQ, BK>(s, j, f_lo, f_hi, scale, C, t, i, hc, rc, qi, tig);
    online_softmax_rescale(s, m, l, o);

    // O += P V (the S accumulators are the A fragments: acc_to_a)
#pragma unroll
    for (int kc = 0; kc < KC_PV; ++kc) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc_to_a<Elem>(pa[mt], s[mt], kc);
#pragma unroll
      for (int dp = 0; dp < NT_O / 2; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, sVs + v_lane + kc * 16 * ROW_BYTES + dp * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(o[mt][2 * dp], pa[mt], vb[0], vb[1]);
          mma_16816<Elem>(o[mt][2 * dp + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }

    j = j_next;
    stage ^= 1;
  }

  // Epilogue: O normalised in registers, LSE, then O through shared memory.
  const long long row_base = (long long)b * a.Hq + h;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const float sum = quad_sum(l[mt][rh]);
      const float inv = inv_or_zero(sum);
#pragma unroll
      for (int nt = 0; nt < NT_O; ++nt) {
        o[mt][nt][rh * 2] *= inv;
        o[mt][nt][rh * 2 + 1] *= inv;
      }
      const int row = i * BQ + warp * ROWS_PER_WARP + mt * 16 + rh * 8 + g;
      if (a.lse != nullptr && tig == 0 && row < QLEN) a.lse[row_base * QLEN + row] = row_lse(m[mt][rh], 1.f, sum);
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  store_o(o, reinterpret_cast<Elem*>(smem_raw), a, b, h, i, QLEN, warp, lane, g, tig);
}

// ------------------------------------------------------------------------------------- host side

AttngenKernelInfo kernel_info() {
  return {ATTNGEN_ABI_VERSION, (int)sizeof(AttngenFwdArgs), D, kDtypeCode, BQ, BK, NTHREADS, SMEM_BYTES, kArch};
}

bool accepts_scale(float) { return true; }  // the scores are scaled before the softmax: any scale works

int launch(const AttngenFwdArgs& a, cudaStream_t stream) {
  int dev = 0, sms = 0;
  const cudaError_t err = prepare_device(attngen_fwd_kernel, SMEM_BYTES, dev, sms);
  if (err != cudaSuccess) return (int)err;
  const dim3 grid((unsigned)((a.Lq + BQ - 1) / BQ), (unsigned)a.Hq, (unsigned)a.B);
  attngen_fwd_kernel<<<grid, NTHREADS, SMEM_BYTES, stream>>>(a);
  return (int)cudaGetLastError();
}

}  // namespace
