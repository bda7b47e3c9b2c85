// bwd_sm80.cuh: attention backward for sm80+ (the portable kernel, also run on H100/H200), FlashAttention-2
// style, in three launches on one stream:
//  1. preprocess, a block per q-block (bwd_pre.cuh, shared with the sm90 backward): delta = rowsum(dO * O)
//     (fp32), lse in the log2 domain (+inf for rows with nothing kept and for the padding of the last q-block),
//     the fp32 dQ accumulator zeroed;
//  2. the main kernel, one CTA per (kv-block j of BK rows, kv head, batch), grid (ceil(Lk/BK), Hkv, B): K and V
//     resident in shared memory; for each query head of the kv head (GQA / MQA: dK and dV are summed over
//     them in registers) and each q-block of BQ rows the mask does not prove EMPTY (block_range_bwd.cuh), Q,
//     dO and the row statistics double-buffered with cp.async, then on mma.sync m16n8k16:
//       S^T = K Q^T -> P^T (bwd_probs.cuh),  dP^T = V dO^T,  dV += P^T dO,  dS^T = P^T (dP^T - delta),
//       dK += dS^T Q,  dS^T -> shared,  dQ_acc += dS K (red.global.add.f32);
//     warp w owns kv rows [wm*16*MT, (wm+1)*16*MT) (wm = w % WM) and the dK / dV columns of its part wn = w / WM
//     of the head dim (WN > 1 at large head dims: the WN warps of a row slice recompute its S^T and dP^T
//     instead of holding all D columns of dK and dV);
//  3. postprocess: dQ = dQ_acc * scale in the input dtype (below).
// dK is scaled once at the end, dQ in the postprocess. Configuration (Elem, D, BQ, BK, NWARPS, WN, MIN_BLOCKS,
// kDtypeCode, kArch) and variant.inc come from the including attngen_bwd.cu (templates/attngen_bwd.cu.j2).
#pragma once

#include "attngen_common.cuh"
#include "attngen_bwd_abi.cuh"
#include "sm80_tiles.cuh"
#include "block_range_bwd.cuh"
#include "bwd_probs.cuh"
#include "bwd_pre.cuh"
#include "host_abi_bwd.cuh"

namespace {

using namespace attngen;

constexpr int NTHREADS = NWARPS * 32;
constexpr int WM = NWARPS / WN;         // warps along the kv rows
constexpr int MT = BK / (16 * WM);      // m16 kv slices per warp
constexpr int DW = D / WN;              // dK / dV columns per warp
constexpr int NT_Q = BQ / 8;            // n8 tiles of S^T (q columns)
constexpr int NT_D = DW / 8;            // n8 tiles of this warp's dK / dV
constexpr int KC_D = D / 16;            // k16 steps of K Q^T and V dO^T
constexpr int KC_Q = BQ / 16;           // k16 steps of P^T dO and dS^T Q
constexpr int KC_K = BK / 16;           // k16 steps of dS K

// Shared memory, in padded rows (sm80_tiles.cuh; dS^T's rows padded the same way): K, V [BK][LDS]; Q, dO
// [STAGES][BQ][LDS]; dS^T [BK][LDS_S]; the row statistics [STAGES][2][BQ] floats (lse_log2, delta).
using Rows = PaddedRows<Elem, D, NTHREADS>;
constexpr int LDS = Rows::LDS;
constexpr int ROW_BYTES = Rows::ROW_BYTES;
constexpr int LDS_S = BQ + Rows::PAD;
constexpr int ROW_S_BYTES = LDS_S * 2;
constexpr int Q_TILE = BQ * LDS;  // elements
constexpr int KV_TILE = BK * LDS;
constexpr int DS_TILE = BK * LDS_S;
constexpr int STAGES = 2;
constexpr int STATS_OFFSET = (2 * KV_TILE + 2 * STAGES * Q_TILE + DS_TILE) * 2;  // bytes
constexpr int SMEM_BYTES = STATS_OFFSET + STAGES * 2 * BQ * 4;

static_assert(attngen_head_dim_supported(D), "head dim: one of ATTNGEN_HEAD_DIMS");
static_assert((BQ / 8) % 2 == 0, "padding argument of sm80_tiles.cuh for dS^T: BQ/8 even");
static_assert(NWARPS % WN == 0 && BK % (16 * WM) == 0 && MT >= 1, "BK must be a multiple of 16 * (NWARPS / WN)");
static_assert(DW % 16 == 0, "each warp's dK / dV columns come in ldmatrix.x4 pairs of n8 tiles");
static_assert(BQ % 16 == 0 && D % 32 == 0, "dQ work items are 16 q rows x 32 columns");
static_assert(NTHREADS >= BQ / 2, "one thread per 16-byte chunk of the row statistics");

// Q, dO and the row statistics of q-block s.i of head s.h into one stage (the statistics are padded to whole
// q-blocks by the preprocess, so they need no bounds).
__device__ __forceinline__ void load_q_block(uint32_t sQ, uint32_t sdO, uint32_t sStats, const AttngenBwdArgs& a,
                                             int b, const QStep& s, int Lq_pad, int tid) {
  const Elem* qbase = static_cast<const Elem*>(a.q) + (long long)b * a.q_stride[0] + (long long)s.h * a.q_stride[1];
  const Elem* dobase =
      static_cast<const Elem*>(a.dout) + (long long)b * a.do_stride[0] + (long long)s.h * a.do_stride[1];
  Rows::load<BQ>(sQ, qbase, a.q_stride[2], s.i * BQ, a.Lq, tid);
  Rows::load<BQ>(sdO, dobase, a.do_stride[2], s.i * BQ, a.Lq, tid);
  if (tid < BQ / 2) {
    const long long row = ((long long)b * a.Hq + s.h) * Lq_pad + (long long)s.i * BQ;
    const int which = tid / (BQ / 4), chunk = tid % (BQ / 4);
    const float* src = (which == 0 ? a.lse_log2 : a.delta) + row + chunk * 4;
    cp_async_16(sStats + (uint32_t)((which * BQ + chunk * 4) * 4), src, true);
  }
}

// dQ_acc rows [0, nrows) of this q-block (dq_rows: its first row, D floats per row) += dS K, dS^T from shared
// memory ([BK][LDS_S]) and K ([BK][LDS]). Work items of 16 q rows x 32 columns are dealt to the warps; each
// thread adds its 16 accumulators with red.global.add.f32 (other kv blocks add to the same rows).
__device__ __forceinline__ void add_dq(uint32_t sdS, uint32_t sK, float* dq_rows, int nrows, int warp, int lane,
                                       int g, int tig) {
  constexpr int MQ = BQ / 16;
  constexpr int ITEMS = MQ * (D / 32);
  // dS as the A operand (q x kv) from dS^T stored kv-major, via ldmatrix.trans: matrices (kv 0-7, q 0),
  // (kv 0-7, q 8), (kv 8-15, q 0), (kv 8-15, q 8) are a0..a3 after the transpose.
  const uint32_t ds_lane = lane_b<ROW_S_BYTES>(lane);
  // K as the B operand (kv x d), as V in the forward.
  const uint32_t k_lane = lane_b_trans<ROW_BYTES>(lane);
  for (int w = warp; w < ITEMS; w += NWARPS) {
    const int mq = w % MQ, dc = w / MQ;
    float acc[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < KC_K; ++kc) {
      uint32_t da[4];
      ldmatrix_x4_trans(da, sdS + ds_lane + kc * 16 * ROW_S_BYTES + mq * 32);
#pragma unroll
      for (int dp = 0; dp < 2; ++dp) {
        uint32_t kb[4];
        ldmatrix_x4_trans(kb, sK + k_lane + kc * 16 * ROW_BYTES + (dc * 32 + dp * 16) * 2);
        mma_16816<Elem>(acc[2 * dp], da, kb[0], kb[1]);
        mma_16816<Elem>(acc[2 * dp + 1], da, kb[2], kb[3]);
      }
    }
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int row = mq * 16 + rh * 8 + g;
      if (row < nrows) {
        float* dst = dq_rows + (long long)row * D + dc * 32 + tig * 2;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          atomicAdd(dst + n * 8, acc[n][rh * 2]);
          atomicAdd(dst + n * 8 + 1, acc[n][rh * 2 + 1]);
        }
      }
    }
  }
}

// Rows of a finished dK or dV fragment (times f) to global memory, rows past KVLEN skipped.
__device__ __forceinline__ void store_kv_grad(void* out, const long long (&st)[3], int b, int kvh, int row0,
                                              int col0, int KVLEN, const float (&x)[MT][NT_D][4], float f) {
  Elem* base = static_cast<Elem*>(out) + (long long)b * st[0] + (long long)kvh * st[1];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      const int row = row0 + mt * 16 + rh * 8;
      if (row < KVLEN) {
        Elem* dst = base + (long long)row * st[2] + col0;
#pragma unroll
        for (int nt = 0; nt < NT_D; ++nt)
          *reinterpret_cast<uint32_t*>(dst + nt * 8) = pack2<Elem>(x[mt][nt][rh * 2] * f, x[mt][nt][rh * 2 + 1] * f);
      }
    }
  }
}

__global__ void __launch_bounds__(NTHREADS, MIN_BLOCKS) attngen_bwd_kernel(const __grid_constant__ AttngenBwdArgs a) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t sK = smem_addr(smem_raw);
  const uint32_t sV = sK + KV_TILE * 2;
  const uint32_t sQ = sV + KV_TILE * 2;                 // [STAGES][BQ][LDS]
  const uint32_t sdO = sQ + STAGES * Q_TILE * 2;        // [STAGES][BQ][LDS]
  const uint32_t sdS = sdO + STAGES * Q_TILE * 2;       // [BK][LDS_S]
  const uint32_t sStats = sK + STATS_OFFSET;            // [STAGES][2][BQ]
  Elem* const dS_ptr = reinterpret_cast<Elem*>(smem_raw + (sdS - sK));
  const float* const stats_ptr = reinterpret_cast<const float*>(smem_raw + STATS_OFFSET);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;
  const int wm = warp % WM, wn = warp / WM;

  // Under causal-like masks low kv blocks see the most q blocks: they come first in launch order.
  const int j = blockIdx.x;
  const int kvh = blockIdx.y;
  const int b = blockIdx.z;
  const int QLEN = a.Lq, KVLEN = a.Lk;
  const int Lq_pad = (QLEN + BQ - 1) / BQ * BQ;
  const int group = a.Hq / a.Hkv;  // GQA / MQA: consecutive query heads share a kv head
  const int h_end = (kvh + 1) * group;

  const CapturedArgs& C = a.captured;
  TileArgs t;
  t.QLEN = QLEN;
  t.KVLEN = KVLEN;
  t.QOFF = a.q_offset;
  t.b = b;
  t.h = kvh * group;

  const Elem* kbase = static_cast<const Elem*>(a.k) + (long long)b * a.k_stride[0] + (long long)kvh * a.k_stride[1];
  const Elem* vbase = static_cast<const Elem*>(a.v) + (long long)b * a.v_stride[0] + (long long)kvh * a.v_stride[1];

  QStep cur = next_q_tile<BQ, BK>(C, t, j, q_range<BQ, BK>(C, t, j), h_end);

  // Prologue: group 0 = K, V and the first q-block (stage 0).
  Rows::load<BK>(sK, kbase, a.k_stride[2], j * BK, KVLEN, tid);
  Rows::load<BK>(sV, vbase, a.v_stride[2], j * BK, KVLEN, tid);
  if (cur.h < h_end) load_q_block(sQ, sdO, sStats, a, b, cur, Lq_pad, tid);
  cp_async_commit();

  float dk[MT][NT_D][4];
  float dv[MT][NT_D][4];
  zero(dk);
  zero(dv);

  // Per-lane ldmatrix offsets (bytes), sm80_tiles.cuh: K, V rows as the A operand (as Q in the forward); Q, dO
  // rows as the B operand of K Q^T, V dO^T (as K in the forward); dO, Q as the B operand of P^T dO, dS^T Q (k = q
  // rows, read transposed as V in the forward), at this warp's dK / dV columns.
  const uint32_t a_lane = lane_a<ROW_BYTES>(lane, wm * MT * 16);
  const uint32_t bn_lane = lane_b<ROW_BYTES>(lane);
  const uint32_t bt_lane = lane_b_trans<ROW_BYTES>(lane, wn * DW * 2);

  const int kv_row0 = wm * MT * 16 + g;  // this thread's row g of slice 0, inside the kv block
  const int kv0 = j * BK + kv_row0;
  const float scale = a.scale;
  HeadCtx hc = head_ctx(C, b, t.h);
  ColCtx cc[MT][2];
  int ctx_h = -1;

  int stage = 0;
  while (cur.h < h_end) {
    QStep nxt = cur;
    ++nxt.i;
    nxt = next_q_tile<BQ, BK>(C, t, j, nxt, h_end);

    __syncthreads();  // every warp is done with the other stage and with dS^T
    if (nxt.h < h_end) {
      load_q_block(sQ + (uint32_t)((stage ^ 1) * Q_TILE * 2), sdO + (uint32_t)((stage ^ 1) * Q_TILE * 2),
                   sStats + (uint32_t)((stage ^ 1) * 2 * BQ * 4), a, b, nxt, Lq_pad, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    if (cur.h != ctx_h) {  // a new query head: its HeadCtx and this CTA's kv columns' ColCtx
      ctx_h = cur.h;
      hc = head_ctx(C, b, cur.h);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) cc[mt][rh] = col_ctx(C, hc, min(kv0 + mt * 16 + rh * 8, KVLEN - 1));
      }
    }
    t.h = cur.h;
    const int i = cur.i;
    const uint32_t sQs = sQ + (uint32_t)(stage * Q_TILE * 2);
    const uint32_t sdOs = sdO + (uint32_t)(stage * Q_TILE * 2);
    const float* lse2 = stats_ptr + stage * 2 * BQ;
    const float* delta = lse2 + BQ;

    // S^T = K Q^T
    float s[MT][NT_Q][4];
    zero(s);
#pragma unroll
    for (int kc = 0; kc < KC_D; ++kc) {
      uint32_t ka[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(ka[mt], sK + a_lane + mt * 16 * ROW_BYTES + kc * 32);
#pragma unroll
      for (int np = 0; np < NT_Q / 2; ++np) {
        uint32_t qb[4];
        ldmatrix_x4(qb, sQs + bn_lane + np * 16 * ROW_BYTES + kc * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(s[mt][2 * np], ka[mt], qb[0], qb[1]);
          mma_16816<Elem>(s[mt][2 * np + 1], ka[mt], qb[2], qb[3]);
        }
      }
    }

    // P^T: mask_mod only where the tile is not known FULL, the bounds mask on tiles past either end
    float gs[MT][NT_Q][4];  // d score_mod / d score (unused without a score_mod)
    const bool masked = q_tile_masked<BQ, BK>(C, t, cur, j);
    const bool bounds = (i + 1) * BQ > QLEN || (j + 1) * BK > KVLEN;
    const int q0 = i * BQ;
    probs_t_for(masked, bounds, s, gs, scale, C, hc, cc, kv0, q0, t, lse2, tig);

    // dV += P^T dO
#pragma unroll
    for (int kc = 0; kc < KC_Q; ++kc) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc_to_a<Elem>(pa[mt], s[mt], kc);
#pragma unroll
      for (int dp = 0; dp < NT_D / 2; ++dp) {
        uint32_t ob[4];
        ldmatrix_x4_trans(ob, sdOs + bt_lane + kc * 16 * ROW_BYTES + dp * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(dv[mt][2 * dp], pa[mt], ob[0], ob[1]);
          mma_16816<Elem>(dv[mt][2 * dp + 1], pa[mt], ob[2], ob[3]);
        }
      }
    }

    // dP^T = V dO^T
    float dp[MT][NT_Q][4];
    zero(dp);
#pragma unroll
    for (int kc = 0; kc < KC_D; ++kc) {
      uint32_t va[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(va[mt], sV + a_lane + mt * 16 * ROW_BYTES + kc * 32);
#pragma unroll
      for (int np = 0; np < NT_Q / 2; ++np) {
        uint32_t ob[4];
        ldmatrix_x4(ob, sdOs + bn_lane + np * 16 * ROW_BYTES + kc * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(dp[mt][2 * np], va[mt], ob[0], ob[1]);
          mma_16816<Elem>(dp[mt][2 * np + 1], va[mt], ob[2], ob[3]);
        }
      }
    }

    // dS^T = P^T (dP^T - delta) [* score_mod'], in place of P^T
    grad_scores_t(s, dp, gs, delta, tig);

    // dK += dS^T Q (scaled at the end); dS^T -> shared for dQ (one warp of each row slice writes it)
#pragma unroll
    for (int kc = 0; kc < KC_Q; ++kc) {
      uint32_t da[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        acc_to_a<Elem>(da[mt], s[mt], kc);
        if (wn == 0) {
          Elem* row = dS_ptr + (kv_row0 + mt * 16) * LDS_S + kc * 16 + tig * 2;
          *reinterpret_cast<uint32_t*>(row) = da[mt][0];
          *reinterpret_cast<uint32_t*>(row + 8 * LDS_S) = da[mt][1];
          *reinterpret_cast<uint32_t*>(row + 8) = da[mt][2];
          *reinterpret_cast<uint32_t*>(row + 8 * LDS_S + 8) = da[mt][3];
        }
      }
#pragma unroll
      for (int dp2 = 0; dp2 < NT_D / 2; ++dp2) {
        uint32_t qb[4];
        ldmatrix_x4_trans(qb, sQs + bt_lane + kc * 16 * ROW_BYTES + dp2 * 32);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_16816<Elem>(dk[mt][2 * dp2], da[mt], qb[0], qb[1]);
          mma_16816<Elem>(dk[mt][2 * dp2 + 1], da[mt], qb[2], qb[3]);
        }
      }
    }
    __syncthreads();  // dS^T complete

    // dQ_acc += dS K
    float* dq_rows = a.dq_accum + (((long long)b * a.Hq + cur.h) * QLEN + q0) * D;
    add_dq(sdS, sK, dq_rows, QLEN - q0, warp, lane, g, tig);

    cur = nxt;
    stage ^= 1;
  }
  cp_async_wait<0>();  // nothing in flight at exit (no q block visited: K / V copies)

  store_kv_grad(a.dk, a.dk_stride, b, kvh, j * BK + kv_row0, wn * DW + tig * 2, KVLEN, dk, scale);
  store_kv_grad(a.dv, a.dv_stride, b, kvh, j * BK + kv_row0, wn * DW + tig * 2, KVLEN, dv, 1.f);
}

// ------------------------------------------------------------------------------------- postprocess
constexpr int POST_THREADS = 256;

// dQ = dQ_acc * scale in Elem from the row-major (B, Hq, Lq, D) dQ_acc, 8 elements (one 16-byte store) per thread
// and step.
__global__ void __launch_bounds__(POST_THREADS) attngen_bwd_post_kernel(const __grid_constant__ AttngenBwdArgs a) {
  const long long n8 = (long long)a.B * a.Hq * a.Lq * (D / 8);
  for (long long idx = (long long)blockIdx.x * POST_THREADS + threadIdx.x; idx < n8;
       idx += (long long)gridDim.x * POST_THREADS) {
    const long long row_id = idx / (D / 8);
    const int c = (int)(idx - row_id * (D / 8));
    const long long bh = row_id / a.Lq;
    const int r = (int)(row_id - bh * a.Lq);
    const int b = (int)(bh / a.Hq), h = (int)(bh % a.Hq);
    const float4* src = reinterpret_cast<const float4*>(a.dq_accum + row_id * D + c * 8);
    const float4 u = src[0], w = src[1];
    const float f = a.scale;
    uint4 v;
    v.x = pack2<Elem>(u.x * f, u.y * f);
    v.y = pack2<Elem>(u.z * f, u.w * f);
    v.z = pack2<Elem>(w.x * f, w.y * f);
    v.w = pack2<Elem>(w.z * f, w.w * f);
    st_global_16(static_cast<Elem*>(a.dq) + b * a.dq_stride[0] + h * a.dq_stride[1] + r * a.dq_stride[2] + c * 8, v);
  }
}

// The postprocess, at most 16 blocks per SM (each loops).
inline void launch_bwd_post(const AttngenBwdArgs& a, int sms, cudaStream_t stream) {
  const long long n8 = (long long)a.B * a.Hq * a.Lq * (D / 8);
  if (n8 > 0) {
    const long long want = (n8 + POST_THREADS - 1) / POST_THREADS;
    const long long blocks = want < (long long)sms * 16 ? want : (long long)sms * 16;
    attngen_bwd_post_kernel<<<(unsigned)blocks, POST_THREADS, 0, stream>>>(a);
  }
}

// ------------------------------------------------------------------------------------- host side

AttngenKernelInfo bwd_kernel_info() {
  return {ATTNGEN_BWD_ABI_VERSION, (int)sizeof(AttngenBwdArgs), D, kDtypeCode, BQ, BK, NTHREADS, SMEM_BYTES, kArch};
}

int launch_bwd(const AttngenBwdArgs& call, cudaStream_t stream) {
  // captured-tensor gradients and the deterministic dQ order are the sm90 kernel's
  if (call.dq_semaphore != nullptr) return ATTNGEN_ERROR_BWD_OPTION;
  for (int i = 0; i < ATTNGEN_MAX_CAPTURED; ++i)
    if (call.dcaptured[i] != nullptr) return ATTNGEN_ERROR_BWD_OPTION;
  AttngenBwdArgs a = call;
  a.dq_written = nullptr;  // this kernel adds every term into a zeroed dQ_acc
  int dev = 0, sms = 0;
  cudaError_t err = prepare_device(attngen_bwd_kernel, SMEM_BYTES, dev, sms);
  if (err != cudaSuccess) return (int)err;
  err = launch_bwd_pre(a, BQ, stream);
  if (err != cudaSuccess) return (int)err;
  const int nkb = (a.Lk + BK - 1) / BK;
  if (nkb > 0 && a.B > 0 && a.Hkv > 0) {
    const dim3 grid((unsigned)nkb, (unsigned)a.Hkv, (unsigned)a.B);
    attngen_bwd_kernel<<<grid, NTHREADS, SMEM_BYTES, stream>>>(a);
  }
  launch_bwd_post(a, sms, stream);
  return (int)cudaGetLastError();
}

}  // namespace
