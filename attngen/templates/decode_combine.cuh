// decode_combine.cuh: the KV-cache kernel's combine (fwd_decode.cuh): with several kv splits, each output row's
// partial O and LSE (fp32) merged by LSE into the output. Include after decode_layout.cuh.
#pragma once

#include "attngen_common.cuh"
#include "attngen_decode_abi.cuh"
#include "pdl.cuh"
#include "decode_layout.cuh"

namespace {

using namespace attngen;

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
