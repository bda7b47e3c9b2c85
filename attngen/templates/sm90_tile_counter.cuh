// sm90_tile_counter.cuh: the global counters a persistent grid takes its work tiles from.
//
// Device side: take_tile (the next untaken tile, an atomic add) and counter_done (the CTA that finishes
// last puts the counter back to zero). Host side: counter_for_launch picks the counter of one launch.
//
// The counters are a zero-initialized __device__ array of this module (no allocation, no memset, so
// nothing here breaks CUDA graph capture), and every launch leaves its counter at zero. What must never
// happen is two launches that can run at the same time sharing one counter: both would take tiles from
// it and each would skip the tiles the other took. So:
//   - an ordinary launch uses the counter of its (device, stream): launches on one stream run one after
//     another;
//   - a launch being captured into a CUDA graph uses a counter of its own per (capture, stream): the
//     graph's replays may run beside ordinary launches on that stream, and replays of one executable
//     graph run one after another. (Two executable graphs instantiated from one captured graph and run
//     at the same time would share it: not supported.)
//   - the per-thread default stream (one handle, a different stream in each thread), a failed capture
//     query, or every counter in use: no counter (nullptr); the kernel then deals the tiles statically.
#pragma once

#include <stdint.h>
#include <mutex>
#include <cuda_runtime.h>

namespace attngen {
// `static` (internal linkage) on the table and its functions: every kernel library keeps its own (two
// libraries in one process must not have their function-local statics unified by the dynamic linker).

constexpr int kTileCounters = 1024;  // per module and device: 8 KiB
constexpr int kMaxDevices = 64;

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
struct CounterKey {
  int device;
  uintptr_t stream;
  unsigned long long capture;  // 0: an ordinary launch; else the capture sequence id
};

struct CounterTable {
  std::mutex mu;
  unsigned int* base[kMaxDevices] = {};  // g_tile_counters on each device (this module's copy)
  CounterKey key[kMaxDevices][kTileCounters];
  int used[kMaxDevices] = {};
};

static CounterTable& counter_table() {
  static CounterTable table;
  return table;
}

// The counter a launch of this module's persistent kernel on `stream` of the current device `dev` uses
// (see the top of this file), or nullptr for the static deal.
static unsigned int* counter_for_launch(int dev, cudaStream_t stream) {
  if (dev < 0 || dev >= kMaxDevices || stream == cudaStreamPerThread) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, &capture) != cudaSuccess) {
    (void)cudaGetLastError();  // not this launch's error: it runs without a counter
    return nullptr;
  }
  if (status == cudaStreamCaptureStatusInvalidated) return nullptr;  // the capture fails anyway
  const CounterKey want{dev, reinterpret_cast<uintptr_t>(stream),
                        status == cudaStreamCaptureStatusActive ? capture : 0ull};
  // The last answer of this thread, for the common case of one stream and no capture.
  static thread_local CounterKey last_key{-1, 0, 0};
  static thread_local unsigned int* last_counter = nullptr;
  if (last_counter != nullptr && last_key.device == want.device && last_key.stream == want.stream &&
      last_key.capture == want.capture)
    return last_counter;

  CounterTable& t = counter_table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.base[dev] == nullptr) {
    void* p = nullptr;
    if (cudaGetSymbolAddress(&p, g_tile_counters) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    t.base[dev] = static_cast<unsigned int*>(p);
  }
  int slot = -1;
  for (int s = 0; s < t.used[dev]; ++s) {
    const CounterKey& k = t.key[dev][s];
    if (k.stream == want.stream && k.capture == want.capture) {
      slot = s;
      break;
    }
  }
  if (slot < 0) {
    if (t.used[dev] == kTileCounters) return nullptr;  // all in use: static deal (correct, slower)
    slot = t.used[dev]++;
    t.key[dev][slot] = want;
  }
  last_key = want;
  last_counter = t.base[dev] + 2 * slot;
  return last_counter;
}

}  // namespace attngen
