// softmax.cuh: online softmax over one kv tile of scores held in an MMA accumulator fragment (layout:
// score_mask.cuh), in the log2 domain (weights 2^x on the SFU's ex2). A row's values live in the 4
// lanes of a quad (same g): row reductions are xor-shuffles 1 and 2. Two forms: the sm90 kernel's
// (raw scores scaled in the exponent's FFMA, tree max, 4 sum chains, a max kept while it grows by at
// most a threshold) and the sm80 kernel's (scores already scaled, one chain, O rescaled in place); moving the
// sm80 kernel to the first is a kernel change, to be measured like any other (docs/performance.md).
#pragma once

#include "attngen_common.cuh"

namespace attngen {

// 2^x with the SFU (max rel. error ~2^-22); exp2(-inf) = +0, which the masked softmax relies on.
ATTNGEN_DEV_INLINE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The max of x over the quad of lanes sharing a row.
ATTNGEN_DEV_INLINE float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
  return x;
}

// sm90 form. Scores s in a domain where 2^(c x) is the softmax weight (c > 0, see score_mask.cuh):
// updates the running row max m (same domain) and this thread's partial row sums l (its columns only;
// quad-reduced in the epilogue), overwrites s with 2^(c (s - m) + P_OFFSET) = 2^(c s - c m + P_OFFSET), one
// FFMA + one ex2 per element, and returns in alpha the factor the previous O rows must be scaled by (rescale_o). The
// per-thread max and sum are trees / split chains, not one serial chain of N/2 dependent ops.
// A row keeps its running max while a tile raises it by at most rescale_threshold (log2 units), so O needs no
// rescale for it (alpha exactly 1): > 0 is FA4's conditional rescale (weights up to 2^threshold, far inside fp32 /
// bf16 / fp16 range); 0 keeps it only when it did not grow, so the row max's weight is exactly 2^P_OFFSET.
// P_OFFSET: the weights are 2^(c (s - m) + P_OFFSET) (FP8's P, FlashAttention-3's max offset: the row max at 256
// and e4m3's normal range 8 binades further down); the row sums carry the same factor, which O / l cancels.
template <int P_OFFSET = 0, int N>
ATTNGEN_DEV_INLINE void online_softmax(float (&s)[N], float c, float rescale_threshold, float (&m)[2], float (&l)[2],
                                       float (&alpha)[2]) {
  constexpr int NT = N / 4;  // n8 chunks: 2 elements per row per chunk
#pragma unroll
  for (int rh = 0; rh < 2; ++rh) {
    float part[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) part[nt] = fmaxf(s[nt * 4 + rh * 2], s[nt * 4 + rh * 2 + 1]);
#pragma unroll
    for (int w = 1; w < NT; w *= 2) {
#pragma unroll
      for (int nt = 0; nt + w < NT; nt += 2 * w) part[nt] = fmaxf(part[nt], part[nt + w]);
    }
    float mx = quad_max(fmaxf(m[rh], part[0]));
    // Small growth of a finite max: keep the old one (false when m is -inf: the difference is +inf or NaN).
    const bool keep_max = (mx - m[rh]) * c <= rescale_threshold;
    if (keep_max) mx = m[rh];
    // Nothing kept in this row yet: subtract 0 instead of -inf, so p = 2^-inf = 0 (not NaN) and
    // alpha = 2^(-inf - 0) = 0 (l and O are still 0 anyway).
    const float m_sub = (mx == -INFINITY) ? 0.f : mx;
    const float neg_cm = -m_sub * c;
    alpha[rh] = keep_max ? 1.f : fast_exp2(fmaf(m[rh], c, neg_cm));
    m[rh] = mx;
    float neg_cm_p = neg_cm;
    if constexpr (P_OFFSET != 0) neg_cm_p += (float)P_OFFSET;
    constexpr int CHAINS = 4;  // independent partial sums: ex2 latency, not FADD latency, sets the pace
    float acc[CHAINS] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p = fast_exp2(fmaf(s[nt * 4 + rh * 2 + e], c, neg_cm_p));
        s[nt * 4 + rh * 2 + e] = p;
        acc[(nt * 2 + e) % CHAINS] += p;
      }
    }
    l[rh] = fmaf(l[rh], alpha[rh], (acc[0] + acc[1]) + (acc[2] + acc[3]));
  }
}

// O *= alpha per row (sm90 form: O in the accumulator layout, alpha from online_softmax). Tiles that raise no
// row max of the warp beyond the rescale threshold leave every alpha at exactly 1: the multiplies are skipped
// warp-wide.
template <int N>
ATTNGEN_DEV_INLINE void rescale_o(float (&o)[N], const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int n = 0; n < N / 4; ++n) {
    o[n * 4 + 0] *= alpha[0];
    o[n * 4 + 1] *= alpha[0];
    o[n * 4 + 2] *= alpha[1];
    o[n * 4 + 3] *= alpha[1];
  }
}

// sm80 form: scores already in the log2 domain (2^x is the weight); for each of the thread's MT x 2 rows,
// the running max m and partial sum l are updated, s becomes 2^(s - m) and O is rescaled in place.
template <int MT, int NT_S, int NT_O>
ATTNGEN_DEV_INLINE void online_softmax_rescale(float (&s)[MT][NT_S][4], float (&m)[MT][2], float (&l)[MT][2],
                                               float (&o)[MT][NT_O][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int rh = 0; rh < 2; ++rh) {
      float mx = m[mt][rh];
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][rh * 2], s[mt][nt][rh * 2 + 1]));
      mx = quad_max(mx);
      const float m_sub = (mx == -INFINITY) ? 0.f : mx;  // as in online_softmax
      const float alpha = fast_exp2(m[mt][rh] - m_sub);
      m[mt][rh] = mx;
      float rowsum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT_S; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = fast_exp2(s[mt][nt][rh * 2 + e] - m_sub);
          s[mt][nt][rh * 2 + e] = p;
          rowsum += p;
        }
      }
      l[mt][rh] = l[mt][rh] * alpha + rowsum;
#pragma unroll
      for (int nt = 0; nt < NT_O; ++nt) {
        o[mt][nt][rh * 2] *= alpha;
        o[mt][nt][rh * 2 + 1] *= alpha;
      }
    }
  }
}

}  // namespace attngen
