// score_mask.cuh: Q K^T accumulators -> softmax scores, in registers: score_mod, mask_mod and the
// bounds mask applied to an MMA accumulator fragment. Shared by the kernels: the mma.sync m16n8 (sm80)
// and wgmma (sm90) accumulator layouts agree per 16-row slice of a warp, thread (g = lane / 4,
// tig = lane % 4) holding rows g and g + 8 at columns 8 nt + 2 tig + {0, 1} of each n8 chunk nt
// (sm80_mma.cuh, sm90_wgmma.cuh). A thread owns MT such slices (m16 tiles); its fragment is
// float[MT][NT][4] (sm80) or float[4 NT] (sm90, MT = 1), element 2 rh + e of chunk nt being row
// g + 8 rh, column 2 tig + e. Include after variant.inc.
#pragma once

#include "attngen_common.cuh"

#ifndef ATTNGEN_SCORE_REL
#define ATTNGEN_SCORE_REL 0  // hand-written variant.inc files (tests/data) that predate relative score mods
#define ATTNGEN_SCORE_REL_LOADS 0
#endif
#ifndef ATTNGEN_SCORE_REL_SCALES
#define ATTNGEN_SCORE_REL_SCALES 0  // variant.inc files from before the define: b(d) may be nonzero
#endif
#ifndef ATTNGEN_SCORE_REL_LINEAR
#define ATTNGEN_SCORE_REL_LINEAR 0  // ... and not known linear in d
#endif
#ifndef ATTNGEN_SCORE_REL_A_CONST
#define ATTNGEN_SCORE_REL_A_CONST 0  // ... and a not known free of d
#endif
// A relative score mod whose b is not linear in d: the kernels may stage its terms per warp (stage_rel_slots), and
// the sm90 backward walks it per diagonal (bwd_probs.cuh's probs_t_rel).
#define ATTNGEN_REL_STAGEABLE (ATTNGEN_SCORE_REL && ATTNGEN_HAS_SCORE_MOD && !ATTNGEN_SCORE_REL_LINEAR)

namespace attngen {

// A staged relative term's bytes (stage_rel_terms): b alone where a does not depend on d (a scale is then the same
// for every diagonal: score_tile_rel works it out once), a scale alone where b is 0, else (a scale, b).
constexpr int REL_SLOT_BYTES = ATTNGEN_SCORE_REL_A_CONST || ATTNGEN_SCORE_REL_SCALES ? 4 : 8;

// Element k (= 2 rh + e) of chunk nt of m16 slice mt, in either fragment shape.
template <int N>
ATTNGEN_DEV_INLINE float& frag_at(float (&s)[N], int /* mt: 0 */, int nt, int k) {
  return s[nt * 4 + k];
}
template <int MT, int NT>
ATTNGEN_DEV_INLINE float& frag_at(float (&s)[MT][NT][4], int mt, int nt, int k) {
  return s[mt][nt][k];
}

#if ATTNGEN_SCORE_REL
// The d at which score_rel reads captured tensors: clamped, where it reads any (ATTNGEN_SCORE_REL_LOADS), to the range
// in-range (q_idx, kv_idx) pairs have, so that past-the-end rows and columns (whose results are discarded) stay in
// bounds.
ATTNGEN_DEV_INLINE int rel_load_d(int d, const TileArgs& t) {
#if ATTNGEN_SCORE_REL_LOADS
  d = min(max(d, t.QOFF - (t.KVLEN - 1)), t.QOFF + t.QLEN - 1);
#endif
  return d;
}

// Relative score mods, score_mod(s) = a(d) s + b(d) with d = q_idx - kv_idx (variant.inc's score_rel), on
// the sm90 fragment (one m16 slice): x = (a scale) qk + b, the score itself, one FFMA per element
// (softmax factor log2(e): raw_score_factor). Row g + 8 at chunk nt has the d of row g at chunk nt - 1,
// so a thread's 4 NT elements need 2 (NT + 1) evaluations of score_rel, two chunks' worth live at a time;
// each gets d and float(d) (from one conversion per tile: exact below 2^24). Row g + 8 is q_idx + 8 unless
// it lies past QLEN (clamped in qi, never stored): its d is then off, harmless for arithmetic; for loads
// d is clamped to the range that in-range (q_idx, kv_idx) pairs have. Masks as in score_tile. When b is 0
// (ATTNGEN_SCORE_REL_SCALES: s / (1 + c d^2), s * table[d]) x = a qk, and the softmax factor carries the scale
// instead (raw_score_factor; scale > 0 here, see score_tile): one FMUL per evaluation fewer. When b is linear in d
// (ATTNGEN_SCORE_REL_LINEAR: alibi), b at d0 - k is b(d0) - k slope, one FFMA per evaluation (within an ulp of b(d0)).
// STAGED (the sm90 forward's REL_STAGED): the terms come from the warp's shared slots (stage_rel_terms) instead,
// rel_base being this thread's rel_slot_base there.
template <bool MASK, bool BOUNDS, bool STAGED = false, typename Frag>
ATTNGEN_DEV_INLINE void score_tile_rel(Frag& s, float scale, const CapturedArgs& C, const TileArgs& t,
                                       const HeadCtx& hc, const RowCtx (&rc)[1][2], const int (&qi)[1][2], int kv0,
                                       int tig, uint32_t rel_base = 0) {
  constexpr int NT = sizeof(Frag) / (sizeof(float) * 4);  // n8 chunks
  const int KVLEN = t.KVLEN;
  const int d0 = qi[0][0] + 8 - (kv0 + 2 * tig);  // d of row g + 8 at chunk 0, e = 0
  const float fd0 = (float)d0;
  auto rel_at = [&](int k) {  // score_rel at d0 - k
    return score_rel(C, hc, rel_load_d(d0 - k, t), fd0 - (float)k);
  };
#if ATTNGEN_SCORE_REL_LINEAR
  const RelTerms r0 = rel_at(0);  // b(d0), the base of the others (a(d0)'s loads, if any, at the clamped d)
  const float b_slope = score_rel_slope(C, hc);
#endif
  // STAGED with a free of d: a scale from one evaluation (its load of b, unused, compiled away)
  const float a_const =
      STAGED && ATTNGEN_SCORE_REL_A_CONST ? rel_at(0).a * (ATTNGEN_SCORE_REL_SCALES ? 1.f : scale) : 0.f;
  auto terms = [&](int k) {  // the terms at d0 - k
    if constexpr (STAGED) {  // d0 - k is slot 8 NT + 1 - k above rel_base (rel_slot_base)
      const uint32_t at = rel_base + (uint32_t)(REL_SLOT_BYTES * (8 * NT + 1 - k));
      RelTerms r{a_const, 0.f};
      if constexpr (ATTNGEN_SCORE_REL_A_CONST) {
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r.b) : "r"(at));
      } else if constexpr (ATTNGEN_SCORE_REL_SCALES) {
        asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(r.a) : "r"(at));
      } else {
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(r.a), "=f"(r.b) : "r"(at));
      }
      return r;
    }
#if ATTNGEN_SCORE_REL_LINEAR
    RelTerms r = k == 0 ? r0 : rel_at(k);
    r.b = fmaf(-(float)k, b_slope, r0.b);
#else
    RelTerms r = rel_at(k);
#endif
    if (!ATTNGEN_SCORE_REL_SCALES) r.a *= scale;
    return r;
  };
  RelTerms prev[2] = {terms(0), terms(1)};
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const RelTerms cur[2] = {terms(8 * (nt + 1)), terms(8 * (nt + 1) + 1)};
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = kv0 + nt * 8 + tig * 2 + e;
      const bool col_ok = !BOUNDS || col < KVLEN;
#if ATTNGEN_HAS_MASK
      const int kv = BOUNDS ? min(col, KVLEN - 1) : col;
      const ColCtx cc = col_ctx(C, hc, kv);
#endif
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        float& x = frag_at(s, 0, nt, rh * 2 + e);
        const RelTerms& r = rh == 0 ? cur[e] : prev[e];
        const float y = fmaf(x, r.a, r.b);
        bool keep = col_ok;
#if ATTNGEN_HAS_MASK
        if (MASK) keep = keep & mask_mod(C, hc, rc[0][rh], cc, qi[0][rh], kv);
#endif
        x = keep ? y : -INFINITY;
      }
    }
    prev[0] = cur[0];
    prev[1] = cur[1];
  }
}

// The warp-wide loop of both kernels' staged terms (this stage_rel_terms, bwd_probs.cuh's stage_rel_terms_t): lane l
// evaluates score_rel at d = d_lo + k for k = l, l + 32, ... below SLOTS (rel_load_d's d, as the walks read it) and
// hands the terms to put(k, terms).
// The first __syncwarp keeps the stores behind the lanes' reads of the last tile's terms, the second ahead of this
// tile's.
template <int SLOTS, class Put>
ATTNGEN_DEV_INLINE void stage_rel_slots(const CapturedArgs& C, const TileArgs& t, const HeadCtx& hc, int d_lo, int lane,
                                        Put put) {
  __syncwarp();
#pragma unroll
  for (int k0 = 0; k0 < SLOTS; k0 += 32) {
    const int k = k0 + lane;
    if (k < SLOTS) put(k, score_rel(C, hc, rel_load_d(d_lo + k, t), (float)(d_lo + k)));
  }
  __syncwarp();
}

// The staged form of score_tile_rel's terms (REL_STAGED): a warp's 16 rows and a kv tile's BK = 8 NT columns span
// 8 NT + 15 diagonals, so the warp evaluates score_rel once per diagonal (about 5 per lane at BK = 128) into its
// `slots` in shared memory (REL_SLOT_BYTES each, from the lowest d up), where each thread would evaluate 2 (NT + 1)
// of them (a table load with its index arithmetic, or a reciprocal on the exponentials' unit). q_warp: the q_idx
// of the warp's first row, past QLEN or not (such rows' d are clamped for the loads, and their scores never stored).
template <int NT>
ATTNGEN_DEV_INLINE void stage_rel_terms(uint32_t slots, float scale, const CapturedArgs& C, const TileArgs& t,
                                        const HeadCtx& hc, int q_warp, int kv0, int lane) {
  stage_rel_slots<8 * NT + 15>(C, t, hc, q_warp - kv0 - (8 * NT - 1), lane, [&](int k, RelTerms r) {
    if (!ATTNGEN_SCORE_REL_SCALES) r.a *= scale;
    const uint32_t at = slots + (uint32_t)(REL_SLOT_BYTES * k);
    if constexpr (ATTNGEN_SCORE_REL_A_CONST) {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(r.b));
    } else if constexpr (ATTNGEN_SCORE_REL_SCALES) {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(at), "f"(r.a));
    } else {
      asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(r.a), "f"(r.b));
    }
  });
}
#endif

// Where thread (g, tig)'s relative terms start in its warp's slots (stage_rel_terms): its d0 (score_tile_rel) is
// slot g - 2 tig + 8 NT + 7, and the lowest it reads, d0 - 8 NT - 1, is slot g - 2 tig + 6 >= 0.
ATTNGEN_DEV_INLINE uint32_t rel_slot_base(uint32_t slots, int lane) {
  return slots + (uint32_t)(REL_SLOT_BYTES * ((lane >> 2) - 2 * (lane & 3) + 6));
}

// S (fp32 accumulators of Q K^T, unscaled) -> scores; a mask evaluating false gives -inf.
// With a score_mod, x = score_mod(qk * scale) * log2(e). Without one, RAW keeps x = qk (the softmax
// folds the factor scale * log2(e) into its exponent's FFMA, which needs scale > 0: attngen_fwd refuses
// scale <= 0 with ATTNGEN_ERROR_SCALE_NOT_POSITIVE and the Python side rewrites the call), else
// x = qk * scale * log2(e). A per-head factor (score_mod(s) = a[h] s) counts as part of the scale: RAW keeps
// x = qk too (score_kv_tile passes RAW only where scale a[h] > 0), else x = qk * scale * a[h] * log2(e). MASK:
// evaluate mask_mod (the tile is not known FULL); BOUNDS: the tile straddles KVLEN, columns past it are -inf.
// score_mod / mask_mod / col_ctx only see in-range indices: past-the-end columns (and, via qi, past-the-end
// rows) are clamped to the last valid index and their results discarded.
template <bool MASK, bool BOUNDS, bool RAW, typename Frag, int MT>
ATTNGEN_DEV_INLINE void score_tile(Frag& s, float scale, const CapturedArgs& C, const HeadCtx& hc,
                                   const RowCtx (&rc)[MT][2], const int (&qi)[MT][2], int kv0, int KVLEN, int tig) {
  constexpr int NT = sizeof(Frag) / (sizeof(float) * 4 * MT);  // n8 chunks
#if !ATTNGEN_HAS_SCORE_MOD
  const float scale_log2 = scale * LOG2E;
#elif ATTNGEN_SCORE_HEAD_SCALE
  // score_mod(s) = a s with a per-head factor a: one multiply per element unless RAW
  const float head_log2 = scale * score_head_scale(C, hc) * LOG2E;
#endif
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = kv0 + nt * 8 + tig * 2 + e;
      const bool col_ok = !BOUNDS || col < KVLEN;
      const int kv = BOUNDS ? min(col, KVLEN - 1) : col;
#if ATTNGEN_HAS_SCORE_MOD || ATTNGEN_HAS_MASK
      const ColCtx cc = col_ctx(C, hc, kv);
#endif
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int rh = 0; rh < 2; ++rh) {
          float& x = frag_at(s, mt, nt, rh * 2 + e);
#if ATTNGEN_HAS_SCORE_MOD && ATTNGEN_SCORE_HEAD_SCALE
          const float y = RAW ? x : x * head_log2;
#elif ATTNGEN_HAS_SCORE_MOD
          const float y = score_mod(x * scale, C, hc, rc[mt][rh], cc, qi[mt][rh], kv) * LOG2E;
#else
          const float y = RAW ? x : x * scale_log2;
#endif
          bool keep = col_ok;
#if ATTNGEN_HAS_MASK
          if (MASK) keep = keep & mask_mod(C, hc, rc[mt][rh], cc, qi[mt][rh], kv);
#endif
          x = keep ? y : -INFINITY;
        }
      }
    }
  }
}

#if ATTNGEN_HAS_SCORE_MOD && ATTNGEN_SCORE_HEAD_SCALE
// score_mod(s) = a[h] s: the scale and a[h] in one factor
ATTNGEN_DEV_INLINE float head_score_factor(float scale, const CapturedArgs& C, const HeadCtx& hc) {
  return scale * score_head_scale(C, hc);
}
// Whether the RAW path keeps this head's scores as raw q.k: only a positive factor keeps the row max's order.
ATTNGEN_DEV_INLINE bool head_scores_raw(float scale, const CapturedArgs& C, const HeadCtx& hc) {
  return head_score_factor(scale, C, hc) > 0.f;
}
#endif

// Factor c of the softmax domain of RAW scores (2^(c x) is the weight of score x).
ATTNGEN_DEV_INLINE float raw_score_factor(float scale, const CapturedArgs& C, const HeadCtx& hc) {
#if ATTNGEN_SCORE_REL && ATTNGEN_SCORE_REL_SCALES
  return scale * LOG2E;  // score_tile_rel's x is the score over the scale
#elif ATTNGEN_SCORE_REL
  return LOG2E;  // score_tile_rel's x is the score
#elif ATTNGEN_HAS_SCORE_MOD && ATTNGEN_SCORE_HEAD_SCALE
  return head_scores_raw(scale, C, hc) ? head_score_factor(scale, C, hc) * LOG2E : 1.f;
#elif ATTNGEN_HAS_SCORE_MOD
  return 1.f;
#else
  return scale * LOG2E;
#endif
}

// score_tile with MASK and BOUNDS known at run time.
template <bool RAW, typename Frag, int MT>
ATTNGEN_DEV_INLINE void score_tiles(Frag& s, bool masked, bool bounds, float scale, const CapturedArgs& C,
                                    const HeadCtx& hc, const RowCtx (&rc)[MT][2], const int (&qi)[MT][2], int kv0,
                                    int KVLEN, int tig) {
  if (masked) {
    if (bounds) score_tile<true, true, RAW>(s, scale, C, hc, rc, qi, kv0, KVLEN, tig);
    else score_tile<true, false, RAW>(s, scale, C, hc, rc, qi, kv0, KVLEN, tig);
  } else {
    if (bounds) score_tile<false, true, RAW>(s, scale, C, hc, rc, qi, kv0, KVLEN, tig);
    else score_tile<false, false, RAW>(s, scale, C, hc, rc, qi, kv0, KVLEN, tig);
  }
}

// The scores of visited kv tile j of q-block i in a (BQ x BK)-tiled kernel: mask_mod only where the
// tile is not known FULL (outside [f_lo, f_hi) of its KvRange, and not proven FULL by the classifier's
// tile_all), the bounds mask only on the tile that straddles KVLEN.
// REL_STAGED: a relative score mod's terms from the warp's shared slots, this thread's at rel_base
// (stage_rel_terms, rel_slot_base).
template <bool RAW, int BQ, int BK, bool REL_STAGED = false, typename Frag, int MT>
ATTNGEN_DEV_INLINE void score_kv_tile(Frag& s, int j, int f_lo, int f_hi, float scale, const CapturedArgs& C,
                                      const TileArgs& t, int i, const HeadCtx& hc, const RowCtx (&rc)[MT][2],
                                      const int (&qi)[MT][2], int tig, uint32_t rel_base = 0) {
  bool masked = false;
#if ATTNGEN_HAS_MASK
  masked = !(j >= f_lo && j < f_hi);
#if ATTNGEN_NEEDS_CLASSIFIER
  if (masked) masked = !tile_all<BQ, BK>(C, t, i, j);
#endif
#endif
  const bool bounds = (j + 1) * BK > t.KVLEN;
  const int kv0 = j * BK;
#if ATTNGEN_SCORE_REL
  if constexpr (RAW) {  // the sm90 kernel: raw_score_factor is this path's (log2(e) times the scale with SCALES)
    static_assert(MT == 1, "score_tile_rel walks the sm90 fragment (one m16 slice)");
    if (masked) {
      if (bounds) score_tile_rel<true, true, REL_STAGED>(s, scale, C, t, hc, rc, qi, kv0, tig, rel_base);
      else score_tile_rel<true, false, REL_STAGED>(s, scale, C, t, hc, rc, qi, kv0, tig, rel_base);
    } else {
      if (bounds) score_tile_rel<false, true, REL_STAGED>(s, scale, C, t, hc, rc, qi, kv0, tig, rel_base);
      else score_tile_rel<false, false, REL_STAGED>(s, scale, C, t, hc, rc, qi, kv0, tig, rel_base);
    }
    return;
  }
#endif
#if ATTNGEN_HAS_SCORE_MOD && ATTNGEN_SCORE_HEAD_SCALE
  // a per-head factor: raw scores where head_scores_raw (raw_score_factor's test), the product per element else
  if (RAW && !head_scores_raw(scale, C, hc)) {
    score_tiles<false>(s, masked, bounds, scale, C, hc, rc, qi, kv0, t.KVLEN, tig);
    return;
  }
#endif
  score_tiles<RAW>(s, masked, bounds, scale, C, hc, rc, qi, kv0, t.KVLEN, tig);
}

}  // namespace attngen
