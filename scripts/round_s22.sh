#!/usr/bin/env bash
# Session 22's device calls.
# A: cross_tile first in the ladder of masks without a score_mod or captured tensors at head dim 64 (jit/tiles.py
#    sm90_ladder): the API suite's head-dim-64 cases (their libraries built by the ladder, odd lengths), the tile
#    sweep of the shipped rung against cross_tile for four such masks at D = 64, then the forward benchmark at D = 64
#    beside flex and cuDNN (issue 15: causal at D = 64 >= 1.0x cuDNN SDPA).
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
esac
