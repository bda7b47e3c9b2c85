// sm90_tile_counter.cuh: the global counters a persistent grid takes its work tiles from.
//
// Device side: take_tile (the next untaken tile, an atomic add) and counter_done (the CTA that finishes
// last puts the counter back to zero). Host side: counter_for_launch picks the counter of one launch, one
// slot of a table of this module (launch_counters.cuh: which launches may share one, what happens when none is
// left); with no counter the kernel deals the tiles statically.
#pragma once

#include "launch_counters.cuh"

namespace attngen {

constexpr int kTileCounters = 1024;  // per module and device: 8 KiB

// Two words per counter: [0] tiles taken past the first gridDim.x, [1] CTAs finished taking.
static __device__ unsigned int g_tile_counters[kTileCounters][2];

// The next work tile of this CTA (tiles 0 .. gridDim.x - 1 are the CTAs' first), or -1 when none is left.
__device__ __forceinline__ int take_tile(unsigned int* counter, int ntiles) {
  const int w = (int)gridDim.x + (int)atomicAdd(counter, 1u);
  return w < ntiles ? w : -1;
}

// Called once per CTA after its last take_tile. The last CTA to get here has seen every other CTA's last
// take_tile complete (each fences before counting itself), so it can reset both words for the next launch.
__device__ __forceinline__ void counter_done(unsigned int* counter) {
  __threadfence();
  if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
    atomicExch(counter, 0u);
    atomicExch(counter + 1, 0u);
  }
}

// ---------------------------------------------------------------------------------- host side

// The counter a launch of this module's persistent kernel on `stream` of the current device `dev` uses,
// or nullptr for the static deal.
static unsigned int* counter_for_launch(int dev, cudaStream_t stream) {
  static CounterTable<kTileCounters> table;
  return counter_slot_for_launch(table, g_tile_counters, dev, stream);
}

}  // namespace attngen
