#!/usr/bin/env bash
# Session 22's device calls.
# A: cross_tile first in the ladder of masks without a score_mod or captured tensors at head dim 64 (jit/tiles.py
#    sm90_ladder): the API suite's head-dim-64 cases (their libraries built by the ladder, odd lengths), the tile
#    sweep of the shipped rung against cross_tile for four such masks at D = 64, then the forward benchmark at D = 64
#    beside flex and cuDNN (issue 15: causal at D = 64 >= 1.0x cuDNN SDPA).
# B: the decode kernel merging its splits in the last CTA of each row group (one kernel per split call; the combine
#    kernel where a launch has no counters): the decode suite with its new cases, the decode call's kernels at issue
#    12's B = 1 shape, merged in the kernel and by the combine kernel (ATTNGEN_DECODE_COMBINE_KERNEL=1), then
#    bench_decode beside SDPA and flex (issue 12's bar: 4.0 TB/s).
# D: the persistent sm90 backward (wip/persistent-bwd.patch, applied on the device) with its consumers reading their
#    tile's fields once per work tile and the producer's ring count in a register (session 22): the small cases, then
#    bwd_tiles_ab.py on it (a CTA per kv block, then persistent), then the landed kernel the same way in a second
#    process (the tree as committed, copied before the patch is applied), then the backward suites.
# E: the persistent backward as landed: memcheck and racecheck over the backward's small cases, then the training
#    anchors beside flex and cuDNN (issue 11's bar: 1.3x flex, 1.0x cuDNN on causal and full).
# F: the other three training anchors on the persistent backward (did not run: too little device time was left).
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
    for env in "" "ATTNGEN_DECODE_COMBINE_KERNEL=1"; do
      env $env timeout 60 python scripts/profile_decode.py --B 1 --L 131072 2>&1 | grep -v arn \
        | sed "s/^/[${env:-in-kernel merge}] /" | tee -a "$R/profile_decode.txt"; done
    timeout 220 python benchmarks/bench_decode.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    pack_results ;;
  D)
    mkdir -p /tmp/landed && cp -r attngen scripts benchmarks tests pyproject.toml /tmp/landed/
    git apply wip/persistent-bwd.patch || { echo "patch does not apply"; exit 1; }
    smoke_backward 90 || { pack_results; exit 0; }
    timeout 130 python scripts/bwd_tiles_ab.py --variants causal sliding_window document full \
      --set persistent=0 ladder 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    (cd /tmp/landed && ATTNGEN_CACHE_DIR=/tmp/attngen-cache-landed PYTHONPATH=/tmp/landed timeout 90 python \
      scripts/bwd_tiles_ab.py --variants causal sliding_window document full --set ladder) 2>&1 \
      | tee "$R/bwd_tiles_ab_landed.log" | grep -E "TFLOP|grad"
    run_tests bwd 170 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    pack_results ;;
  E)
    smoke_backward 90 || { pack_results; exit 0; }
    sanitize_backward memcheck 90
    sanitize_backward racecheck 75
    timeout 200 python benchmarks/bench_training.py --variants sliding_window document full causal --out "$R" 2>&1 \
      | tee "$R/training.log" | grep -E "^\||rror"
    pack_results ;;
  F)
    timeout 190 python benchmarks/bench_training.py --variants softcap_causal alibi_causal prefix_lm --out "$R" 2>&1 \
      | tee "$R/training.log" | grep -E "^\||rror"
    pack_results ;;
esac
