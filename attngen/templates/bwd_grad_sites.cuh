// bwd_grad_sites.cuh: the gradients of the captured tensors a score_mod reads, summed inside the sm90
// backward (bwd_sm90.cuh). Every kept element (q_idx, kv_idx) adds dy * d score_mod / d element to the
// element's fp32 gradient, dy = dL / d score_mod = P (dP - delta). variant.inc's grad_site gives the
// derivative and the element's offset; grad_site_kind says how a tile's contributions are summed before they
// reach global memory:
//   1  the offset reads neither q_idx nor kv_idx (slopes[h], scale[b, h]): a register per thread, summed over
//      the warp, one atomic add per warp and tile;
//   2  it reads q_idx - kv_idx only (table[h, q - kv + L - 1]): a shared-memory bin per diagonal of the
//      consumer's 64 x BQ tile, in 4 copies so that no two lanes of a warp add at one address or bank; one
//      atomic add per non-zero diagonal and tile;
//   0  anything else (bias[q, kv]): one atomic add per kept element.
// Include after variant.inc.
#pragma once

#include "attngen_common.cuh"

namespace attngen {

#if defined(ATTNGEN_NUM_GRAD_SITES) && ATTNGEN_HAS_SCORE_MOD
constexpr int kGradSites = ATTNGEN_NUM_GRAD_SITES;
constexpr int kGradDiagSites = ATTNGEN_GRAD_DIAG_SITES;
#else
constexpr int kGradSites = 0;
constexpr int kGradDiagSites = 0;
#endif
constexpr int GRAD_SITE_ELEM = 0, GRAD_SITE_TILE = 1, GRAD_SITE_DIAG = 2;  // codegen.grad_site_kinds
constexpr int GRAD_ROWS = 64;   // kv rows of one consumer's tile (its wgmma M)
constexpr int GRAD_BINS = 128;  // diagonals of one site: the GRAD_ROWS + BQ - 1 of a tile, in each copy
// A lane (g, tig) of an m16n8 fragment (rows g, g + 8, columns 8 nt + 2 tig + e) adds to copy tig: the lanes on
// one diagonal (2 tig - g equal) differ in tig, so in address, and a copy stride of 128 + 6 floats puts the 32
// lanes' bins (bank 8 tig - g + const) in 32 different banks.
constexpr int GRAD_COPY = GRAD_BINS + 6;
constexpr int GRAD_SITE_FLOATS = 4 * GRAD_COPY;  // one diagonal site's bins of one tile

// One consumer thread's view of the sites of this call.
struct GradSites {
  float* dcap[kGradSites > 0 ? kGradSites : 1];  // site k's tensor's gradient (fp32, its strides), or null
  float tile[kGradSites > 0 ? kGradSites : 1];   // kind 1: this thread's sum over the current tile
  uint32_t bins;  // kind 2: this lane's bin of fragment element (nt, rh, e) = (0, 0, 0) in the current tile's bins
};

// The shared address of this lane's first bin in `bins` ([kGradDiagSites][4][GRAD_COPY] floats), lane `lane` of
// warp wq (rows 16 wq .. of the consumer's 64): bin col - row + 63.
ATTNGEN_DEV_INLINE uint32_t grad_sites_lane_bins(uint32_t bins, int lane, int wq) {
  const int g = lane >> 2, tig = lane & 3;
  return bins + 4u * (uint32_t)(tig * GRAD_COPY + 2 * tig - g - 16 * wq + GRAD_ROWS - 1);
}

ATTNGEN_DEV_INLINE void red_add_shared(uint32_t addr, float v) {
  asm volatile("red.shared.add.f32 [%0], %1;\n" ::"r"(addr), "f"(v));
}

ATTNGEN_DEV_INLINE void red_add_global(float* p, float v) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(p), "f"(v));
}

// Kept element (q_idx, kv_idx), fragment element (nt, rh, e), with dL / d score_mod = dy at the score
// score_mod received. HELD: kind 2 adds to held[k], a register the caller sums the element's diagonal in and
// hands to grad_sites_add_held (bwd_probs.cuh's probs_t_rel), instead of to the bins.
template <bool HELD = false>
ATTNGEN_DEV_INLINE void grad_sites_add(GradSites& gs, float dy, float score, const CapturedArgs& C, const HeadCtx& hc,
                                       const RowCtx& rc, const ColCtx& cc, int q_idx, int kv_idx, int nt, int rh,
                                       int e, float* held = nullptr) {
#if ATTNGEN_HAS_SCORE_MOD
#pragma unroll
  for (int k = 0; k < kGradSites; ++k) {
    if (gs.dcap[k] == nullptr) continue;  // this call does not ask for the tensor's gradient
    long long off;
    const float v = dy * grad_site(k, score, C, hc, rc, cc, q_idx, kv_idx, off);
    if (grad_site_kind(k) == GRAD_SITE_TILE) gs.tile[k] += v;
    else if (grad_site_kind(k) == GRAD_SITE_DIAG && HELD) held[k] += v;
    else if (grad_site_kind(k) == GRAD_SITE_DIAG)
      red_add_shared(gs.bins + 4u * (uint32_t)(grad_site_bin(k) * GRAD_SITE_FLOATS + 8 * (nt - rh) + e), v);
    else red_add_global(gs.dcap[k] + off, v);
  }
#endif
}

// The held sums of the diagonal of fragment elements (chunk + rh, rh, e) into the bins, and zeroed.
ATTNGEN_DEV_INLINE void grad_sites_add_held(const GradSites& gs, float* held, int chunk, int e) {
#if ATTNGEN_HAS_SCORE_MOD
#pragma unroll
  for (int k = 0; k < kGradSites; ++k) {
    if (grad_site_kind(k) != GRAD_SITE_DIAG || gs.dcap[k] == nullptr) continue;
    red_add_shared(gs.bins + 4u * (uint32_t)(grad_site_bin(k) * GRAD_SITE_FLOATS + 8 * chunk + e), held[k]);
    held[k] = 0.f;
  }
#endif
}

// Kind 1 at the end of a tile, by every lane of the warp: the warp's sum, added by lane 0 at the offset of the
// in-bounds element (q_idx, kv_idx) (every element of the tile has the same one).
ATTNGEN_DEV_INLINE void grad_sites_flush_tile(GradSites& gs, const CapturedArgs& C, const HeadCtx& hc, int q_idx,
                                              int kv_idx, int lane) {
#if ATTNGEN_HAS_SCORE_MOD
#pragma unroll
  for (int k = 0; k < kGradSites; ++k) {
    if (grad_site_kind(k) != GRAD_SITE_TILE || gs.dcap[k] == nullptr) continue;
    float v = gs.tile[k];
    gs.tile[k] = 0.f;
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    if (lane == 0 && v != 0.f) {
      long long off;
      grad_site(k, 0.f, C, hc, row_ctx(C, hc, q_idx), col_ctx(C, hc, kv_idx), q_idx, kv_idx, off);
      red_add_global(gs.dcap[k] + off, v);
    }
  }
#endif
}

// Kind 2 once every thread of the consumer added its elements of the tile (after a barrier): thread `tid` of
// the consumer warpgroup takes bin tid of each site (its 4 copies), the diagonal col - row = tid - (GRAD_ROWS - 1), and zeroes
// it for the tile after next (the bins are double-buffered). The offset is taken at the diagonal's first
// element, (row, col) = (max(0, 63 - tid), max(0, tid - 63)) from (kv_row0, q0): its row and column are the
// smallest on the diagonal, so it lies before QLEN / KVLEN whenever any element of the diagonal does.
ATTNGEN_DEV_INLINE void grad_sites_flush_bins(const GradSites& gs, uint32_t bins, const CapturedArgs& C,
                                              const HeadCtx& hc, int q0, int kv_row0, int tid) {
#if ATTNGEN_HAS_SCORE_MOD
#pragma unroll
  for (int k = 0; k < kGradSites; ++k) {
    if (grad_site_kind(k) != GRAD_SITE_DIAG || gs.dcap[k] == nullptr) continue;  // not asked for: never written
    float v = 0.f;
#pragma unroll
    for (int copy = 0; copy < 4; ++copy) {
      const uint32_t addr = bins + 4u * (uint32_t)(grad_site_bin(k) * GRAD_SITE_FLOATS + copy * GRAD_COPY + tid);
      float x;
      asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(x) : "r"(addr));
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(0.f));
      v += x;
    }
    if (v != 0.f) {
      const int row = max(0, GRAD_ROWS - 1 - tid);
      const int q_idx = q0 + row + tid - (GRAD_ROWS - 1);
      const int kv_idx = kv_row0 + row;
      long long off;
      grad_site(k, 0.f, C, hc, row_ctx(C, hc, q_idx), col_ctx(C, hc, kv_idx), q_idx, kv_idx, off);
      red_add_global(gs.dcap[k] + off, v);
    }
  }
#endif
}

}  // namespace attngen
