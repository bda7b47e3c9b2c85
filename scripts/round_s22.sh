#!/usr/bin/env bash
# Session 22's device calls.
# A: cross_tile first in the ladder of masks without a score_mod or captured tensors at head dim 64 (jit/tiles.py
#    sm90_ladder): the API suite's head-dim-64 cases (their libraries built by the ladder, odd lengths), the tile
#    sweep of the shipped rung against cross_tile for four such masks at D = 64, then the forward benchmark at D = 64
#    beside flex and cuDNN (issue 15: causal at D = 64 >= 1.0x cuDNN SDPA).
# B: the decode kernel merging its splits in the last CTA of each row group (one kernel per split call; the combine
#    kernel where a launch has no counters): the decode suite with its new cases, the tile counters' test (their host
#    lookup moved to launch_counters.cuh) and round A's head-dim-64 cases on the final ladder (cross_tile on causal
#    only), then the decode call's kernels at issue 12's B = 1 and B = 8 shapes, merged in the kernel and by the
#    combine kernel (ATTNGEN_DECODE_COMBINE_KERNEL=1).
# C: bench_decode beside SDPA and flex (issue 12's bar: 4.0 TB/s), the greedy-decoding loop's suite.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests api64 200 tests/gpu/test_gpu_api.py -k "head_dim_64 or dtypes_and_head_dims"
    timeout 130 python scripts/tile_sweep.py --variants causal,sliding_window,dilated_window,local_global --D 64 \
      --tiles 128x3-rt8-pers,128x3-rt8-pers-cross 2>&1 | tee "$R/tile_sweep_d64.md" | grep -E "^\||rror"
    timeout 200 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal full sliding_window \
      --head-dim 64 2>&1 | tee "$R/bench-d64.log" | grep -E "^\||rror" | tail -n 6
    pack_results ;;
  B)
    run_tests decode 200 -n 4 tests/gpu/test_decode_gpu.py
    run_tests api 150 tests/gpu/test_gpu_api.py -k "head_dim_64 or persistent_grid_counters"
    for BL in "1 131072" "8 32768"; do set -- $BL
      timeout 60 python scripts/profile_decode.py --B $1 --L $2 2>&1 | grep -v arn | tee -a "$R/profile_decode.txt"
      ATTNGEN_DECODE_COMBINE_KERNEL=1 timeout 60 python scripts/profile_decode.py --B $1 --L $2 2>&1 | grep -v arn \
        | sed "s/^/[combine kernel] /" | tee -a "$R/profile_decode.txt"; done
    pack_results ;;
  C)
    timeout 220 python benchmarks/bench_decode.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    run_tests llama 90 tests/gpu/test_llama_decode_gpu.py
    pack_results ;;
esac
