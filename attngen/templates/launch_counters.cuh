// launch_counters.cuh: which slot of a module's global counter table a kernel launch uses (host side).
//
// Kernels that count across CTAs (sm90_tile_counter.cuh: a persistent grid's work tiles; fwd_decode.cuh: the
// splits of a row group that have finished) keep their counters in a zero-initialized __device__ array of
// their module, SLOTS slots of WORDS counters (no allocation, no memset, so nothing here breaks CUDA graph
// capture), and every launch leaves its slot at zero. What must never happen is two launches that can run at
// the same time sharing one slot: each would count the other's CTAs. So:
//   - an ordinary launch uses the slot of its (device, stream): launches on one stream run one after another;
//   - a launch being captured into a CUDA graph uses a slot of its own per (capture, stream): the graph's
//     replays may run beside ordinary launches on that stream, and replays of one executable graph run one
//     after another. (Two executable graphs instantiated from one captured graph and run at the same time
//     would share it: not supported.)
//   - the per-thread default stream (one handle, a different stream in each thread), a failed capture query,
//     or every slot in use: no slot (nullptr); the kernel then works without counters (each says how).
#pragma once

#include <stdint.h>
#include <mutex>
#include <cuda_runtime.h>

namespace attngen {
// `static` (internal linkage) on the tables and functions: every kernel library keeps its own (two libraries
// in one process must not have their function-local statics unified by the dynamic linker).

constexpr int kMaxDevices = 64;

struct CounterKey {
  int device;
  uintptr_t stream;
  unsigned long long capture;  // 0: an ordinary launch; else the capture sequence id
};

// The host's record of one counter table: who holds each of its SLOTS slots, per device.
template <int SLOTS>
struct CounterTable {
  std::mutex mu;
  unsigned int* base[kMaxDevices] = {};  // the __device__ array on each device (this module's copy)
  CounterKey key[kMaxDevices][SLOTS];
  int used[kMaxDevices] = {};
};

// The slot of `counters` (a __device__ array of this module, `t` its record) that a launch on `stream` of the
// current device `dev` uses (see the top of this file), or nullptr.
template <int SLOTS, int WORDS>
static unsigned int* counter_slot_for_launch(CounterTable<SLOTS>& t, unsigned int (&counters)[SLOTS][WORDS], int dev,
                                             cudaStream_t stream) {
  if (dev < 0 || dev >= kMaxDevices || stream == cudaStreamPerThread) return nullptr;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, &capture) != cudaSuccess) {
    (void)cudaGetLastError();  // not this launch's error: it runs without counters
    return nullptr;
  }
  if (status == cudaStreamCaptureStatusInvalidated) return nullptr;  // the capture fails anyway
  const CounterKey want{dev, reinterpret_cast<uintptr_t>(stream),
                        status == cudaStreamCaptureStatusActive ? capture : 0ull};
  // The last answer of this thread, for the common case of one stream and no capture.
  static thread_local const CounterTable<SLOTS>* last_table = nullptr;
  static thread_local CounterKey last_key{-1, 0, 0};
  static thread_local unsigned int* last_slot = nullptr;
  if (last_table == &t && last_key.device == want.device && last_key.stream == want.stream &&
      last_key.capture == want.capture)
    return last_slot;

  std::lock_guard<std::mutex> lock(t.mu);
  if (t.base[dev] == nullptr) {
    void* p = nullptr;
    if (cudaGetSymbolAddress(&p, counters) != cudaSuccess) {
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
    if (t.used[dev] == SLOTS) return nullptr;  // all in use
    slot = t.used[dev]++;
    t.key[dev][slot] = want;
  }
  last_table = &t;
  last_key = want;
  last_slot = t.base[dev] + WORDS * slot;
  return last_slot;
}

}  // namespace attngen
