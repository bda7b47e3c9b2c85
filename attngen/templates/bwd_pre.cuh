// bwd_pre.cuh: the launch ahead of either backward main kernel (bwd_sm80.cuh, bwd_sm90.cuh), on its stream, a
//  block per q-block: delta = rowsum(dO * O) (fp32), lse in the log2 domain (+inf for rows with nothing kept and
//  for the padding of the last q-block, so P = 0 there), the fp32 dQ accumulator zeroed, or, where the main kernel
//  stores its first addition to each chunk (AttngenBwdArgs.dq_written), the chunks' flags instead; a family may
//  add blocks of its own ahead of the q-blocks' (the sm90 kernel's work-tile order). Each kernel family has its own
//  postprocess, for the layout it keeps dQ_acc in. Configuration (Elem, D) from the including
//  attngen_bwd.cu.
#pragma once

#include "attngen_common.cuh"
#include "attngen_bwd_abi.cuh"
#include "pdl.cuh"
#include "sm80_mma.cuh"  // unpack2

namespace {

using namespace attngen;

__device__ __forceinline__ float dot8(const uint4& x, const uint4& y) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
  float acc = 0.f;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    const float2 u = unpack2<Elem>(xs[n]), v = unpack2<Elem>(ys[n]);
    acc = fmaf(u.x, v.x, acc);
    acc = fmaf(u.y, v.y, acc);
  }
  return acc;
}

constexpr int PRE_THREADS = 256;
// Each row takes PRE_LANES lanes (an aligned group of its warp), PRE_PIECES of them with 16 bytes of O and dO.
constexpr int PRE_PIECES = D / 8;
constexpr int PRE_LANES = PRE_PIECES <= 8 ? 8 : PRE_PIECES <= 16 ? 16 : 32;
constexpr int PRE_ROWS = PRE_THREADS / PRE_LANES;  // rows per step of a block
static_assert(D % 8 == 0 && PRE_PIECES <= 32, "the preprocess reads a row in at most 32 pieces of 8 elements");

// What a family's preprocess does besides the q-blocks: Extra::block(a, n) in each of its first `extra` blocks (the
// sm90 kernel's work-tile order, bwd_sm90.cuh; first, so that they run beside the q-blocks, not after them).
struct NoExtraBlocks {
  __device__ static void block(const AttngenBwdArgs&, int) {}
};

// Block `extra + tile`, tile = (b * Hq + h) * nqb + i: the bq rows of q-block i of head (b, h), rows past Lq
// padding: delta, lse_log2 (+inf for rows with nothing kept and padding), the rows of dQ_acc zeroed (whichever
// layout the main kernel keeps in a q-block's bq * D floats) or the q-block's two dq_written flags; tile 0 also
// zeroes the work-tile counter.
template <class Extra>
__global__ void __launch_bounds__(PRE_THREADS) attngen_bwd_pre_kernel(const __grid_constant__ AttngenBwdArgs a,
                                                                      int bq, int extra) {
  pdl_launch_dependents<PDL>();
  pdl_wait<PDL>();  // launched as a dependent: the kernel ahead (the forward, a previous call) may still run
  if ((int)blockIdx.x < extra) {
    Extra::block(a, (int)blockIdx.x);
    return;
  }
  const int nqb = (a.Lq + bq - 1) / bq;
  const long long tile = (long long)blockIdx.x - extra;
  const long long bh = tile / nqb;
  const int i = (int)(tile - bh * nqb);
  const int b = (int)(bh / a.Hq), h = (int)(bh % a.Hq);
  const int piece = threadIdx.x % PRE_LANES;
  if (tile == 0 && threadIdx.x == 0 && a.tile_counter != nullptr) *a.tile_counter = 0;
  const bool zero_acc = a.dq_written == nullptr;
  if (!zero_acc && threadIdx.x == 0) reinterpret_cast<int2*>(a.dq_written)[tile] = make_int2(0, 0);
  for (int step = 0; step < bq; step += PRE_ROWS) {  // the same steps for every warp: the shuffles take all lanes
    const int rr = step + (int)threadIdx.x / PRE_LANES;
    const int r = i * bq + rr;
    const bool real = rr < bq && r < a.Lq;
    float delta = 0.f;
    if (real && piece < PRE_PIECES) {
      const uint4* o = reinterpret_cast<const uint4*>(static_cast<const Elem*>(a.o) + b * a.o_stride[0] +
                                                      h * a.o_stride[1] + r * a.o_stride[2]);
      const uint4* d = reinterpret_cast<const uint4*>(static_cast<const Elem*>(a.dout) + b * a.do_stride[0] +
                                                      h * a.do_stride[1] + r * a.do_stride[2]);
      delta = dot8(o[piece], d[piece]);
    }
#pragma unroll
    for (int m = PRE_LANES / 2; m >= 1; m >>= 1) delta += __shfl_xor_sync(0xffffffffu, delta, m);
    if (rr >= bq) continue;
    const long long row_id = bh * nqb * bq + r;
    if (zero_acc && piece < PRE_PIECES) {
      float4* acc = reinterpret_cast<float4*>(a.dq_accum + row_id * D) + 2 * piece;
      acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if (piece == 0) {
      float lse2 = INFINITY;
      if (real) {
        const float lse = a.lse[bh * a.Lq + r];
        lse2 = lse == -INFINITY ? INFINITY : lse * LOG2E;
      }
      a.delta[row_id] = delta;  // 0 for padding rows
      a.lse_log2[row_id] = lse2;
    }
  }
}

// The preprocess over every q-block of bq rows, a block each, after `extra` blocks of Extra's; with pdl, launched as
// a programmatic dependent of the kernel ahead of it on the stream (pdl.cuh).
template <class Extra = NoExtraBlocks>
inline cudaError_t launch_bwd_pre(const AttngenBwdArgs& a, int bq, cudaStream_t stream, bool pdl = false,
                                  int extra = 0) {
  const long long tiles = (long long)a.B * a.Hq * ((a.Lq + bq - 1) / bq);
  cudaError_t rc = cudaSuccess;
  if (tiles + extra > 0)
    rc = launch_kernel(pdl, attngen_bwd_pre_kernel<Extra>, dim3((unsigned)(tiles + extra)), dim3(PRE_THREADS), 0,
                       stream, a, bq, extra);
  // without q-blocks no block zeroes the counter (the main kernel still runs its kv blocks' empty walks)
  if (rc == cudaSuccess && tiles == 0 && a.tile_counter != nullptr)
    rc = cudaMemsetAsync(a.tile_counter, 0, sizeof(int), stream);
  return rc;
}

}  // namespace
