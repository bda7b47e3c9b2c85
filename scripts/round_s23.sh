#!/usr/bin/env bash
# Session 23's device calls.
# A: the sm90 backward's first stores (Sm90BwdTiles.first_store: dQ_acc not zeroed by the preprocess, the first
#    addition into each chunk a store, a flag per chunk): the small cases, the backward, deterministic and autograd
#    suites (with the first-store test), session 22's head-dim-64 ladder test, then bwd_tiles_ab.py first_store=0
#    against 1 on four training anchors in one process.
# B: the training anchors beside flex and cuDNN on the tree as landed (issue 11's bar: 1.3x flex, 1.0x cuDNN on
#    causal and full), then memcheck and racecheck over the backward's small cases.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    smoke_backward 90 || { pack_results; exit 0; }
    run_tests bwd 200 -n 4 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    run_tests api64 120 -n 4 tests/gpu/test_gpu_api.py -k "head_dim_64_masks_on_their_ladder"
    timeout 170 python scripts/bwd_tiles_ab.py --variants causal sliding_window document full \
      --set first_store=0 first_store=1 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    pack_results ;;
  B)
    timeout 330 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror"
    smoke_backward 60 || { pack_results; exit 0; }
    sanitize_backward memcheck 60
    sanitize_backward racecheck 60
    pack_results ;;
esac
