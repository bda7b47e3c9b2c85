// bwd_probs.cuh: the backward's recomputed probabilities and their gradient, in registers, on the
// TRANSPOSED tile: S^T = K Q^T, an m16n8 accumulator fragment whose rows are kv positions and whose columns
// are q positions (thread (g, tig) holds rows g, g + 8 of each m16 slice mt and columns 8 nt + 2 tig + {0, 1};
// element 2 rh + e of s[mt][nt]). score_mod / mask_mod see the same HeadCtx / RowCtx / ColCtx as in the
// forward's score_tile (score_mask.cuh), with the roles of rows and columns swapped: a CTA's kv rows are
// fixed, so their ColCtx are made once per head, and RowCtx once per q column here.
// Include after variant.inc.
#pragma once

#include "attngen_common.cuh"
#include "softmax.cuh"  // fast_exp2
#include "bwd_grad_sites.cuh"

// d score_mod / d score comes from variant.inc's score_mod_grad (announced by ATTNGEN_NUM_GRAD_SITES).
#if ATTNGEN_HAS_SCORE_MOD && !defined(ATTNGEN_NUM_GRAD_SITES)
#error "attngen backward: this variant has a score_mod but variant.inc defines no score_mod_grad (ATTNGEN_NUM_GRAD_SITES); regenerate it with a codegen that emits score-gradient functions"
#endif

namespace attngen {

// S^T (fp32 accumulators of K Q^T, unscaled) -> P^T = exp(x - lse) in place, x = score_mod(s * scale) (or
// s * scale), 0 where masked: MASK evaluates mask_mod (the tile is not known FULL), BOUNDS masks q columns
// past QLEN and kv rows past KVLEN (the mods see clamped indices there, results discarded). lse2 points at
// the tile's BQ row log-sum-exps in the log2 domain (+inf for rows with nothing kept, so P = 0, never NaN).
// kv0: the kv position of this thread's row g of slice 0; q0: the tile's first q row. With a score_mod, g
// receives d score_mod / d score at each element.
// GRADS (the sm90 kernel, which holds dP^T when it takes the probabilities): g holds dP^T on entry and receives
// dS^T = P (dP - delta) (times d score_mod / d score), delta per q column at `delta`, in the same pass, so that
// no array of derivatives is kept; without GRADS, g receives d score_mod / d score (grad_scores_t below does
// the rest). With GRADS and `sites`, every kept element also adds to the captured tensors' gradients
// (bwd_grad_sites.cuh).
template <bool MASK, bool BOUNDS, bool GRADS = false, int MT, int NT>
ATTNGEN_DEV_INLINE void probs_t(float (&s)[MT][NT][4], float (&g)[MT][NT][4], float scale, const CapturedArgs& C,
                                const HeadCtx& hc, const ColCtx (&cc)[MT][2], int kv0, int q0, const TileArgs& t,
                                const float* lse2, int tig, const float* delta = nullptr,
                                GradSites* sites = nullptr) {
  static_assert(!GRADS || MT == 1, "GradSites' bins address one 16-row slice per warp");
#if !ATTNGEN_HAS_SCORE_MOD
  const float scale_log2 = scale * LOG2E;
#endif
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 l2 = *reinterpret_cast<const float2*>(lse2 + nt * 8 + 2 * tig);
    float2 d2 = make_float2(0.f, 0.f);
    if (GRADS) d2 = *reinterpret_cast<const float2*>(delta + nt * 8 + 2 * tig);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = q0 + nt * 8 + 2 * tig + e;
      const bool row_ok = !BOUNDS || row < t.QLEN;
      const int q_idx = (BOUNDS ? min(row, t.QLEN - 1) : row) + t.QOFF;
#if ATTNGEN_HAS_SCORE_MOD || ATTNGEN_HAS_MASK
      const RowCtx rc = row_ctx(C, hc, q_idx);
#endif
      const float lse = e ? l2.y : l2.x;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
          float& x = s[mt][nt][rh * 2 + e];
          float& gx = g[mt][nt][rh * 2 + e];
          float grad = 1.f;
          const int kv_raw = kv0 + mt * 16 + rh * 8;
          const int kv = BOUNDS ? min(kv_raw, t.KVLEN - 1) : kv_raw;
#if ATTNGEN_HAS_SCORE_MOD
          const float sc = x * scale;
          const float y = score_mod(sc, C, hc, rc, cc[mt][rh], q_idx, kv) * LOG2E - lse;
          grad = score_mod_grad(sc, C, hc, rc, cc[mt][rh], q_idx, kv);
          if (!GRADS) gx = grad;
#else
          const float y = fmaf(x, scale_log2, -lse);
#endif
          bool keep = !BOUNDS || (row_ok && kv_raw < t.KVLEN);
#if ATTNGEN_HAS_MASK
          if (MASK) keep = keep & mask_mod(C, hc, rc, cc[mt][rh], q_idx, kv);
#endif
          x = keep ? fast_exp2(y) : 0.f;
          // P = 0 (masked, or a row with nothing kept) gives dS = 0 exactly, whatever the derivative there
          if (GRADS) {
            const float dy = x * (gx - (e ? d2.y : d2.x));
            gx = x > 0.f ? dy * grad : 0.f;
#if ATTNGEN_HAS_SCORE_MOD
            if (kGradSites > 0 && sites != nullptr && x > 0.f)
              grad_sites_add(*sites, dy, sc, C, hc, rc, cc[mt][rh], q_idx, kv, nt, rh, e);
#endif
          }
        }
      }
    }
  }
}

// P^T -> dS^T in place: dS = P (dP - delta) (times d score_mod / d score with a score_mod), delta per q
// column (BQ floats at `delta`). Where P = 0 (masked, or a row with nothing kept) dS is exactly 0, whatever
// the derivative there.
template <int MT, int NT>
ATTNGEN_DEV_INLINE void grad_scores_t(float (&p)[MT][NT][4], const float (&dp)[MT][NT][4],
                                      const float (&gs)[MT][NT][4], const float* delta, int tig) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 d2 = *reinterpret_cast<const float2*>(delta + nt * 8 + 2 * tig);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float pk = p[mt][nt][k];
        float ds = pk * (dp[mt][nt][k] - ((k & 1) ? d2.y : d2.x));
#if ATTNGEN_HAS_SCORE_MOD
        ds = pk > 0.f ? ds * gs[mt][nt][k] : 0.f;
#endif
        p[mt][nt][k] = ds;
      }
    }
  }
}

}  // namespace attngen
