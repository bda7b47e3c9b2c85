// bwd_probs.cuh: the backward's recomputed probabilities and their gradient, in registers, on the
// TRANSPOSED tile: S^T = K Q^T, an m16n8 accumulator fragment whose rows are kv positions and whose columns
// are q positions (thread (g, tig) holds rows g, g + 8 of each m16 slice mt and columns 8 nt + 2 tig + {0, 1};
// element 2 rh + e of s[mt][nt]). score_mod / mask_mod see the same HeadCtx / RowCtx / ColCtx as in the
// forward's score_tile (score_mask.cuh), with the roles of rows and columns swapped: a CTA's kv rows are
// fixed, so their ColCtx are made once per head, and RowCtx once per q column here.
// Include after variant.inc.
#pragma once

#include "attngen_common.cuh"
#include "softmax.cuh"     // fast_exp2
#include "score_mask.cuh"  // ATTNGEN_SCORE_REL*'s defaults for variant.inc files without them
#include "bwd_grad_sites.cuh"

// d score_mod / d score comes from variant.inc's score_mod_grad (announced by ATTNGEN_NUM_GRAD_SITES).
#if ATTNGEN_HAS_SCORE_MOD && !defined(ATTNGEN_NUM_GRAD_SITES)
#error "attngen backward: this variant has a score_mod but variant.inc defines no score_mod_grad (ATTNGEN_NUM_GRAD_SITES); regenerate it with a codegen that emits score-gradient functions"
#endif

namespace attngen {

// A staged relative term's bytes (stage_rel_terms_t): b log2(e) alone where a does not depend on d (a and a scale
// log2(e) are then the same for every diagonal: probs_t_rel works them out once), a where b is 0 (a scale log2(e)
// one multiply away), else (a, a scale log2(e), b log2(e), unused).
constexpr int REL_SLOT_BYTES_T = ATTNGEN_SCORE_REL_A_CONST || ATTNGEN_SCORE_REL_SCALES ? 4 : 16;

#if ATTNGEN_REL_STAGEABLE
// probs_t with GRADS for a relative score mod, score_mod(s) = a(d) s + b(d) with d = q_idx - kv_idx (variant.inc's
// score_rel), as the forward's score_tile_rel walks it: element (nt, rh, e) has d = d0 + 8 (nt - rh) + e, so row
// g + 8 at chunk nt has the d of row g at chunk nt - 1 and a thread's 4 NT elements need 2 (NT + 1) evaluations
// of score_rel (each a load for a table) instead of 4 NT of score_mod; d score_mod / d score is a(d). For the
// same reason a diagonal site's two elements of one d are summed in a register before they reach the bins.
// Loads see d clamped to the range in-range (q_idx, kv_idx) pairs have (past-the-end rows and columns are
// discarded). STAGED (REL_STAGED of the sm90 backward): the terms come from the warp's shared slots
// (stage_rel_terms_t), rel_base being this thread's rel_slot_base_t there.
template <bool MASK, bool BOUNDS, bool STAGED, int NT>
ATTNGEN_DEV_INLINE void probs_t_rel(float (&s)[1][NT][4], float (&g)[1][NT][4], float scale, const CapturedArgs& C,
                                    const HeadCtx& hc, const ColCtx (&cc)[1][2], int kv0, int q0, const TileArgs& t,
                                    const float* lse2, int tig, const float* delta, GradSites* sites,
                                    uint32_t rel_base) {
  const int d0 = t.QOFF + q0 + 2 * tig - kv0;  // d of element (0, 0, 0)
  const float fd0 = (float)d0;
  struct Terms {
    float a;       // d score_mod / d score
    float a2, b2;  // the score in the log2 domain: fmaf(qk, a2, b2)
  };
  auto evaluated = [&](int k) {
    const RelTerms r = score_rel(C, hc, rel_load_d(d0 + k, t), fd0 + (float)k);
    return Terms{r.a, r.a * scale * LOG2E, r.b * LOG2E};
  };
  // STAGED with a free of d: a and its scaled form from one evaluation (its load of b, unused, compiled away)
  Terms a_const{};
  if constexpr (STAGED && ATTNGEN_SCORE_REL_A_CONST) a_const = evaluated(0);
  auto terms = [&](int k) {  // at d0 + k
    if constexpr (STAGED) {  // d0 + k is slot 8 + k above rel_base (rel_slot_base_t)
      const uint32_t at = rel_base + (uint32_t)(REL_SLOT_BYTES_T * (8 + k));
      Terms r{a_const.a, a_const.a2, 0.f};
      if constexpr (ATTNGEN_SCORE_REL_A_CONST) {
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r.b2) : "r"(at));
      } else if constexpr (ATTNGEN_SCORE_REL_SCALES) {
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r.a) : "r"(at));
        r.a2 = r.a * scale * LOG2E;
      } else {
        float unused;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(r.a), "=f"(r.a2), "=f"(r.b2), "=f"(unused)
                     : "r"(at));
      }
      return r;
    }
    return evaluated(k);
  };
  // the diagonal sites' sums of this thread's elements on chunk nt - 1 (rh = 1 at nt, after rh = 0 at nt - 1)
  // and on chunk nt (rh = 0), per e
  float held[2][2][kGradSites > 0 ? kGradSites : 1] = {};
  Terms prev[2] = {terms(-8), terms(-7)};  // chunk nt - 1's, for rh = 1
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const Terms cur[2] = {terms(8 * nt), terms(8 * nt + 1)};
    const float2 l2 = *reinterpret_cast<const float2*>(lse2 + nt * 8 + 2 * tig);
    const float2 d2 = *reinterpret_cast<const float2*>(delta + nt * 8 + 2 * tig);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int row = q0 + nt * 8 + 2 * tig + e;
      const bool row_ok = !BOUNDS || row < t.QLEN;
      const int q_idx = (BOUNDS ? min(row, t.QLEN - 1) : row) + t.QOFF;
      const RowCtx rc = row_ctx(C, hc, q_idx);
      const float lse = e ? l2.y : l2.x;
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        float& x = s[0][nt][rh * 2 + e];
        float& gx = g[0][nt][rh * 2 + e];
        const Terms& r = rh == 0 ? cur[e] : prev[e];
        const int kv_raw = kv0 + rh * 8;
        const int kv = BOUNDS ? min(kv_raw, t.KVLEN - 1) : kv_raw;
        const float sc = x * scale;
        const float y = fmaf(x, r.a2, r.b2) - lse;
        bool keep = !BOUNDS || (row_ok && kv_raw < t.KVLEN);
#if ATTNGEN_HAS_MASK
        if (MASK) keep = keep & mask_mod(C, hc, rc, cc[0][rh], q_idx, kv);
#endif
        x = keep ? fast_exp2(y) : 0.f;
        const float dy = x * (gx - (e ? d2.y : d2.x));
        gx = x > 0.f ? dy * r.a : 0.f;
        if (kGradSites > 0 && sites != nullptr && x > 0.f)
          grad_sites_add<true>(*sites, dy, sc, C, hc, rc, cc[0][rh], q_idx, kv, nt, rh, e, held[rh][e]);
      }
    }
    if (kGradDiagSites > 0 && sites != nullptr) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        grad_sites_add_held(*sites, held[1][e], nt - 1, e);
#pragma unroll
        for (int k = 0; k < kGradSites; ++k) {
          held[1][e][k] = held[0][e][k];
          held[0][e][k] = 0.f;
        }
      }
    }
    prev[0] = cur[0];
    prev[1] = cur[1];
  }
  if (kGradDiagSites > 0 && sites != nullptr) {
#pragma unroll
    for (int e = 0; e < 2; ++e) grad_sites_add_held(*sites, held[1][e], NT - 1, e);
  }
}

// The staged form of probs_t_rel's terms (REL_STAGED): a warp's 16 kv rows and a q-block's BQ = 8 NT columns span
// 8 NT + 15 diagonals, so the warp evaluates score_rel once per diagonal (3 per lane at BQ = 64; score_mask.cuh's
// stage_rel_slots) into its `slots` in shared memory (REL_SLOT_BYTES_T each, from the lowest d up), where each
// thread would evaluate 2 (NT + 1). d_lo: the lowest, QOFF + q0 - (the warp's first kv row) - 15.
template <int NT>
ATTNGEN_DEV_INLINE void stage_rel_terms_t(uint32_t slots, float scale, const CapturedArgs& C, const TileArgs& t,
                                          const HeadCtx& hc, int d_lo, int lane) {
  stage_rel_slots<8 * NT + 15>(C, t, hc, d_lo, lane, [&](int k, const RelTerms& r) {
    const uint32_t at = slots + (uint32_t)(REL_SLOT_BYTES_T * k);
    if constexpr (ATTNGEN_SCORE_REL_A_CONST) {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(r.b * LOG2E));
    } else if constexpr (ATTNGEN_SCORE_REL_SCALES) {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(r.a));
    } else {
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(at), "f"(r.a), "f"(r.a * scale * LOG2E),
                   "f"(r.b * LOG2E), "f"(0.f));
    }
  });
}
#endif

// Where thread (g, tig)'s relative terms start in its warp's slots (stage_rel_terms_t): its d0 (probs_t_rel) is slot
// 2 tig - g + 15, and the lowest it reads, d0 - 8, is slot 2 tig - g + 7 >= 0.
ATTNGEN_DEV_INLINE uint32_t rel_slot_base_t(uint32_t slots, int lane) {
  return slots + (uint32_t)(REL_SLOT_BYTES_T * (2 * (lane & 3) - (lane >> 2) + 7));
}

// A q-block's row statistics (lse in the log2 domain, or delta) at one thread's q columns, 8 nt + 2 tig + {0, 1} for
// each nt: read where they are used (stat_pair of a pointer into shared memory), or held in registers, read from
// shared memory ahead of the products they are then issued under (load_stat_pairs; bwd_sm90.cuh's STATS_EARLY).
template <int NT>
struct StatPairs {
  float2 v[NT];
};

ATTNGEN_DEV_INLINE float2 stat_pair(const float* p, int nt, int tig) {
  return *reinterpret_cast<const float2*>(p + nt * 8 + 2 * tig);
}

template <int NT>
ATTNGEN_DEV_INLINE float2 stat_pair(const StatPairs<NT>& p, int nt, int) {
  return p.v[nt];
}

// The loads volatile, so that they stay where they are written: ahead of the products' issue, which is what they are
// read early for (at their use they wait on shared memory that the products' operand reads keep busy).
template <int NT>
ATTNGEN_DEV_INLINE StatPairs<NT> load_stat_pairs(uint32_t at, int tig) {
  StatPairs<NT> r;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                 : "=f"(r.v[nt].x), "=f"(r.v[nt].y)
                 : "r"(at + (uint32_t)(4 * (nt * 8 + 2 * tig))));
  return r;
}

// S^T (fp32 accumulators of K Q^T, unscaled) -> P^T = exp(x - lse) in place, x = score_mod(s * scale) (or
// s * scale), 0 where masked: MASK evaluates mask_mod (the tile is not known FULL), BOUNDS masks q columns
// past QLEN and kv rows past KVLEN (the mods see clamped indices there, results discarded). lse2 holds
// the tile's BQ row log-sum-exps in the log2 domain (stat_pair: a pointer, or StatPairs) (+inf for rows with nothing
// kept, so P = 0, never NaN).
// kv0: the kv position of this thread's row g of slice 0; q0: the tile's first q row. With a score_mod, g
// receives d score_mod / d score at each element.
// GRADS (the sm90 kernel, which holds dP^T when it takes the probabilities): g holds dP^T on entry and receives
// dS^T = P (dP - delta) (times d score_mod / d score), delta per q column at `delta`, in the same pass, so that
// no array of derivatives is kept; without GRADS, g receives d score_mod / d score (grad_scores_t below does
// the rest). With GRADS and `sites`, every kept element also adds to the captured tensors' gradients
// (bwd_grad_sites.cuh).
// REL (the sm90 kernel's Sm90BwdTiles.rel_walk, with GRADS): a relative score mod takes probs_t_rel, unless b(d)
// is linear in d (ALiBi: score_mod per element costs no more than score_rel, and measured a little faster);
// REL_STAGED (with REL), its terms from the warp's shared slots, this thread's at rel_base.
template <bool MASK, bool BOUNDS, bool GRADS = false, bool REL = false, bool REL_STAGED = false, int MT, int NT,
          class Lse>
ATTNGEN_DEV_INLINE void probs_t(float (&s)[MT][NT][4], float (&g)[MT][NT][4], float scale, const CapturedArgs& C,
                                const HeadCtx& hc, const ColCtx (&cc)[MT][2], int kv0, int q0, const TileArgs& t,
                                const Lse& lse2, int tig, const float* delta = nullptr,
                                GradSites* sites = nullptr, uint32_t rel_base = 0) {
  static_assert(!GRADS || MT == 1, "GradSites' bins address one 16-row slice per warp");
#if ATTNGEN_REL_STAGEABLE
  if constexpr (GRADS && REL) {
    probs_t_rel<MASK, BOUNDS, REL_STAGED>(s, g, scale, C, hc, cc, kv0, q0, t, lse2, tig, delta, sites, rel_base);
    return;
  }
#endif
#if !ATTNGEN_HAS_SCORE_MOD
  const float scale_log2 = scale * LOG2E;
#endif
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 l2 = stat_pair(lse2, nt, tig);
    float2 d2 = make_float2(0.f, 0.f);
    if (GRADS) d2 = stat_pair(delta, nt, tig);
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

// probs_t with MASK (the tile is not known FULL) and BOUNDS (it reaches past either end) known only at run time: one
// specialisation per pair, so that FULL tiles inside the bounds evaluate neither; `then` (a callable) runs on the
// masked and on the unmasked side right after probs_t, so that only what it leaves is live where the sides join
// (bwd_sm90.cuh's DS_MUL_PACKED packs P^T there, whose fp32 tile is dead once packed: packed after the join, it was
// held in local memory across the masked paths, 648 bytes spilled on causal's rung).
template <bool GRADS = false, bool REL = false, bool REL_STAGED = false, class Then, class... Args>
ATTNGEN_DEV_INLINE void probs_t_for_then(bool masked, bool bounds, Then&& then, Args&&... args) {
  if (masked) {
    if (bounds) probs_t<true, true, GRADS, REL, REL_STAGED>(args...);
    else probs_t<true, false, GRADS, REL, REL_STAGED>(args...);
    then();
  } else {
    if (bounds) probs_t<false, true, GRADS, REL, REL_STAGED>(args...);
    else probs_t<false, false, GRADS, REL, REL_STAGED>(args...);
    then();
  }
}

// probs_t_for_then with nothing after probs_t.
template <bool GRADS = false, bool REL = false, bool REL_STAGED = false, class... Args>
ATTNGEN_DEV_INLINE void probs_t_for(bool masked, bool bounds, Args&&... args) {
  probs_t_for_then<GRADS, REL, REL_STAGED>(masked, bounds, [] {}, static_cast<Args&&>(args)...);
}

// P^T -> dS^T in place: dS = P (dP - delta) (times d score_mod / d score with a score_mod), delta per q
// column (BQ floats at `delta`, or StatPairs). Where P = 0 (masked, or a row with nothing kept) dS is exactly 0,
// whatever the derivative there.
template <int MT, int NT, class Delta>
ATTNGEN_DEV_INLINE void grad_scores_t(float (&p)[MT][NT][4], const float (&dp)[MT][NT][4],
                                      const float (&gs)[MT][NT][4], const Delta& delta, int tig) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 d2 = stat_pair(delta, nt, tig);
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
