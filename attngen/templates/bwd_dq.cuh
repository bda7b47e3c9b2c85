// bwd_dq.cuh: dQ's way out of the sm90 backward (bwd_sm90.cuh). Its consumers stage each q-block's dQ in shared
// memory; a writer warp per consumer adds it to the fp32 dQ_acc with one bulk copy (write_dq): a store for the first
// addition into a chunk where the preprocess did not zero dQ_acc (DQ_INIT 1, store_or_add_dq), in kv-block order in
// deterministic mode (dq_turn); the postprocess then converts dQ_acc to dq. Include after sm90_bwd_layout.cuh and
// block_range_bwd.cuh; configuration (Elem, D, BQ, BK, PDL) from the including attngen_bwd.cu.
#pragma once

#include "attngen_common.cuh"
#include "attngen_bwd_abi.cuh"
#include "sm80_copy.cuh"  // st_global_16
#include "sm80_mma.cuh"   // pack2
#include "sm90_mbarrier.cuh"
#include "sm90_tma.cuh"
#include "sm90_bwd_layout.cuh"
#include "block_range_bwd.cuh"
#include "pdl.cuh"

namespace {

using namespace attngen;

// Deterministic mode: the dQ additions to q-block i of head h happen in kv-block order, consumer 0 before
// consumer 1, so every element of dQ_acc sums its terms in one order. sem (one int per (b, h, i), zeroed)
// counts turns: kv block j's consumer cw (or its dQ writer) adds when it reads 2 (p + 1) + cw, p being the last kv
// block before j that visits the tile (p = -1 when none), and leaves 2 (p + 1) + 1 (consumer 0) or 2 (j + 1)
// (consumer 1) behind.
// Waiting only on lower kv blocks, which the grid starts first, cannot deadlock.
__device__ __forceinline__ int dq_turn(const CapturedArgs& C, const TileArgs& t, int i, int j) {
  int p = j - 1;
  while (p >= 0 && !q_tile_visited<BQ, BK>(C, t, i, p)) --p;
  return 2 * (p + 1);
}

// DQ_INIT 1 (outside deterministic mode), first stores: dQ_acc is not zeroed. Each chunk's flag (dq_written,
// zeroed by the preprocess) goes 0 -> 1 for the writer that takes it, which stores its staged dQ and, once the store
// is performed, sets 2; every other writer of the chunk waits for 2, then adds. A writer only ever waits for a store
// already issued, so none can wait for good.
__device__ __forceinline__ void store_or_add_dq(int* flag, float* dst, uint32_t buf) {
  int state;
  asm volatile("atom.acquire.gpu.global.cas.b32 %0, [%1], %2, %3;\n" : "=r"(state) : "l"(flag), "r"(0), "r"(1)
               : "memory");
  if (state == 0) {
    bulk_store(dst, buf, DQ_STAGE_BYTES);
    bulk_commit();
    bulk_wait_all();  // performed before the flag lets the additions in
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(flag), "r"(2) : "memory");
    return;
  }
  while (state != 2) {
    __nanosleep(64);
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(state) : "l"(flag) : "memory");
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the acquire, before the async proxy's adds
  bulk_reduce_add_f32(dst, buf, DQ_STAGE_BYTES);
  bulk_commit();
  bulk_wait_read<0>();
}

// ------------------------------------------------------------------------------------------- dQ writers
// Warp 1 + cw of the producer warpgroup: each time consumer cw has staged a q-block's dQ and named it
// in its slot (the tile (b, h, i) and the deterministic turn), one bulk reduction adds it to the tiled dQ_acc, and
// the buffer goes back once the reduction has read it; dq_done ends the loop. The hand-overs are mbarriers
// (dq_full, dq_done: the consumer's 4 warps; dq_empty: the writer), whose arrive / wait order the slot too. The
// writer takes no part in the walk (the classifier's registers stay with the producer thread); in deterministic
// mode it, not the consumer, waits for the tile's turn (dq_turn).
__device__ __forceinline__ void write_dq(const AttngenBwdArgs& a, const BwdSmem& sm, int cw, int lane) {
  const uint32_t buf = sm.dq(cw);
  for (uint32_t phase = 0;; phase ^= 1u) {
    // the next staged dQ, or the end of the consumer's walks (signalled once the last reduction was handed back: by
    // dq_done, and with WAIT_NS then through dq_full too, so that one hinted wait covers both: each consumer warp
    // arrives on dq_done before dq_full, so a phase of dq_full completed with dq_done's is the end)
    if constexpr (WAIT_NS != 0) {
      mbar_wait_for<WAIT_NS>(sm.dq_full(cw), phase);
      if (mbar_test_wait(sm.dq_done(cw), 0)) {  // not try_wait, which would hold every staging for its time limit
        if (lane == 0) bulk_wait_all();
        return;
      }
    } else {
      while (!mbar_try_wait(sm.dq_full(cw), phase)) {
        if (mbar_try_wait(sm.dq_done(cw), 0)) {
          if (lane == 0) bulk_wait_all();
          return;
        }
      }
    }
    long long tile;
    asm volatile("ld.shared.s64 %0, [%1];\n" : "=l"(tile) : "r"(sm.slot(cw) + 8u) : "memory");
    if (lane == 0) {
      float* dst = a.dq_accum + tile * (BQ * D) + DQ_CHUNK * cw * (DQ_STAGE_BYTES / 4);
      if (a.dq_semaphore != nullptr) {
        int* const sem = a.dq_semaphore + tile;
        int turn;
        asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(turn) : "r"(sm.slot(cw) + 4u) : "memory");
        int x;
        do {
          asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(x) : "l"(sem) : "memory");
        } while (x != turn + cw);
        asm volatile("fence.proxy.async.global;\n" ::: "memory");  // the acquire, before the async proxy's adds
        bulk_reduce_add_f32(dst, buf, DQ_STAGE_BYTES);
        bulk_commit();
        bulk_wait_all();  // the additions performed before the turn passes on
        asm volatile("fence.proxy.async.global;\n" ::: "memory");
        // consumer 1 passes the turn to the next kv block: 2 (j + 1), j the kv block of the CTA's one work tile
        // (deterministic mode launches a CTA per tile: turn 0's slot)
        const int j = static_cast<const volatile int*>(sm.tile(0))[0];
        asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(sem), "r"(cw == 0 ? turn + 1 : 2 * (j + 1))
                     : "memory");
      } else if (a.dq_written != nullptr) {
        store_or_add_dq(a.dq_written + 2 * tile + DQ_CHUNK * cw, dst, buf);
      } else {
        bulk_reduce_add_f32(dst, buf, DQ_STAGE_BYTES);
        bulk_commit();
        bulk_wait_read<0>();
      }
    }
    __syncwarp();  // the warp together again before lane 0 hands the buffer back
    if (lane == 0) mbar_arrive(sm.dq_empty(cw));
  }
}

// ------------------------------------------------------------------------------------------- postprocess
// dQ = dQ_acc * scale in Elem, a block per q-block of the tiled dQ_acc: read in the staging order (a warp reads 512
// contiguous bytes), turned into rows in shared memory, and stored 16 bytes per thread along dQ's rows, so that
// every 32-byte sector is written whole (pairs stored where they fall, 4 bytes each, took longer than reading
// dQ_acc 8 bytes at a time: docs/performance.md).
constexpr int POST_THREADS = 256;
constexpr int POST_PITCH = D / 2 + 4;  // 32-bit words per staged row: the 8 rows a warp writes start 4 banks apart
static_assert((BQ * D / 4) % POST_THREADS == 0 && (BQ * D / 8) % POST_THREADS == 0 && (D / 2) % 32 == 0,
              "the postprocess's loops cover a q-block evenly, conflict-free");
constexpr int POST_CHUNK4 = DQ_STAGE_BYTES / 16;  // float4 of a chunk
static_assert(POST_CHUNK4 % POST_THREADS == 0 && NUM_CONSUMERS == 2,
              "each load of the postprocess lies in one of the two chunks");

__global__ void __launch_bounds__(POST_THREADS)
    attngen_bwd_post_tiled_kernel(const __grid_constant__ AttngenBwdArgs a) {
  constexpr int LOADS = BQ * D / 4 / POST_THREADS, STORES = BQ * D / 8 / POST_THREADS;
  __shared__ __align__(16) uint32_t rows[BQ * POST_PITCH];
  const int nqb = (a.Lq + BQ - 1) / BQ;
  const long long tile = blockIdx.x;  // (b * Hq + h) * nqb + i
  const long long bh = tile / nqb;
  const int i = (int)(tile - bh * nqb);
  const float4* src = reinterpret_cast<const float4*>(a.dq_accum) + tile * (BQ * D / 4);
  pdl_launch_dependents<PDL>();
  pdl_wait<PDL>();  // every addition into dQ_acc (PDL: launched while the main kernel drains)
  // a chunk no writer took (first stores: its flag still 0) holds whatever the memory held: it is zero
  const int2 written = a.dq_written == nullptr ? make_int2(1, 1) : reinterpret_cast<const int2*>(a.dq_written)[tile];
  float4 x[LOADS];
#pragma unroll
  for (int n = 0; n < LOADS; ++n) {
    const int chunk = DQ_SPLIT_D ? n * POST_THREADS / POST_CHUNK4 : 0;
    x[n] = (chunk == 0 ? written.x : written.y) != 0 ? __ldcs(src + n * POST_THREADS + threadIdx.x)  // read once
                                                     : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float s = a.scale;
#pragma unroll
  for (int n = 0; n < LOADS; ++n) {
    const int f = n * POST_THREADS + (int)threadIdx.x;
    if constexpr (DQ_T) {  // the four floats lie in four rows: 16-bit stores
      const float e[4] = {x[n].x, x[n].y, x[n].z, x[n].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const DqPlace p = dq_float_place(f, k);
        reinterpret_cast<unsigned short*>(rows)[p.row * 2 * POST_PITCH + p.col] =
            (unsigned short)(pack2<Elem>(e[k] * s, 0.f) & 0xffffu);
      }
    } else {
      const DqPlace p = dq_float4_place(f);
      rows[p.row * POST_PITCH + p.col / 2] = pack2<Elem>(x[n].x * s, x[n].y * s);
      rows[(p.row + 8) * POST_PITCH + p.col / 2] = pack2<Elem>(x[n].z * s, x[n].w * s);
    }
  }
  __syncthreads();
  const int b = (int)(bh / a.Hq), h = (int)(bh % a.Hq);
  Elem* out = static_cast<Elem*>(a.dq) + b * a.dq_stride[0] + h * a.dq_stride[1];
  const int rows_here = min(BQ, a.Lq - i * BQ);  // the last q-block's padding rows are not stored
#pragma unroll
  for (int n = 0; n < STORES; ++n) {
    const int u = n * POST_THREADS + (int)threadIdx.x;
    const int r = u / (D / 8), c = u % (D / 8);
    if (r < rows_here)
      st_global_16(out + (long long)(i * BQ + r) * a.dq_stride[2] + c * 8,
                   *reinterpret_cast<const uint4*>(rows + r * POST_PITCH + 4 * c));
  }
}

}  // namespace
