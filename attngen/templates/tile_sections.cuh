// tile_sections.cuh: the order persistent grids take work tiles in. A work tile is one block (of q rows in the
// forward, of kv rows in the backward) of one (batch, head) pair; the pairs are cut into sections of about one wave of
// tiles, the block index slowest within a section, so that the CTAs running at once share a few heads' K/V or Q/dO in
// L2 while every block index of the section starts before the section's next one (under masks whose work falls or
// rises with the block index, the longest tiles of the section first; docs/performance.md).
#pragma once

#include "attngen_common.cuh"

namespace attngen {

constexpr int kSectionTiles = 128;  // about one wave of CTAs

// Pairs per section: about kSectionTiles tiles, at least one pair (the host's launch counts sections too).
__host__ __device__ __forceinline__ int section_pairs(int blocks, int pairs) {
  return max(1, min(pairs, kSectionTiles / blocks));
}

// Work tile w of `blocks` blocks for each of `pairs` pairs, in sections of `sec_pairs` whole pairs (the last may be
// narrower): the block's place in its section's order (0 first) and the pair.
struct SectionTile {
  int block, pair;
};
ATTNGEN_DEV_INLINE SectionTile section_tile(int w, int blocks, int pairs, int sec_pairs) {
  const int sec = w / (sec_pairs * blocks);
  const int in_sec = w - sec * sec_pairs * blocks;
  const int hs = min(sec_pairs, pairs - sec * sec_pairs);
  return {in_sec / hs, sec * sec_pairs + in_sec % hs};
}

}  // namespace attngen
