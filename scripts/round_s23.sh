#!/usr/bin/env bash
# Session 23's device calls.
# A: the sm90 backward's first stores (Sm90BwdTiles.first_store then, dq_init 1 now: dQ_acc not zeroed by the
#    preprocess, the first addition into each chunk a store, a flag per chunk): the small cases, the backward,
#    deterministic and autograd suites (with the first-store test), session 22's head-dim-64 ladder test, then
#    bwd_tiles_ab.py first_store=0 against 1 on four training anchors in one process. (The first-store test failed
#    for its own reason: one variant object for both settings, so one library; the ladder test ran past its limit.)
# A2: dq_init 2, each q-block's dQ_acc zeroed by the producer warp of the first CTA whose walk loads it: the small
#    cases plain, under memcheck and under racecheck, the backward suites (the dq_init test over 0, 1, 2), then
#    bwd_tiles_ab.py dq_init=0 against 2.
# B: dq_init 1 (first stores) as the default: bwd_tiles_ab.py dq_init 0 / 1 / 2 on the three training anchors A and
#    A2 did not time, session 22's head-dim-64 ladder test, then every training anchor beside flex and cuDNN (issue
#    11's bar: 1.3x flex, 1.0x cuDNN on causal and full).
# C: the two tests of backward settings as refactored (one helper), then the walk rotated (Sm90BwdTiles.walk_shift 2)
#    with first stores against first stores alone, flex's step in the same rounds (bwd_tiles_ab.py --flex): the
#    document and the window, then causal and full.
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
  A2)
    smoke_backward 90 || { pack_results; exit 0; }
    sanitize_backward memcheck 60
    sanitize_backward racecheck 60
    run_tests bwd 200 -n 4 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    timeout 150 python scripts/bwd_tiles_ab.py --variants causal sliding_window document full \
      --set dq_init=0 dq_init=2 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    pack_results ;;
  B)
    timeout 110 python scripts/bwd_tiles_ab.py --variants softcap_causal alibi_causal prefix_lm \
      --set dq_init=0 dq_init=1 dq_init=2 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    run_tests api64 150 -n 4 tests/gpu/test_gpu_api.py -k "head_dim_64_masks_on_their_ladder"
    timeout 320 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror"
    pack_results ;;
  C)
    run_tests settings 100 -n 2 tests/gpu/test_bwd_gpu.py -k "persistent_walks or dq_acc_starts"
    timeout 230 python scripts/bwd_tiles_ab.py --flex --variants document sliding_window causal full \
      --set dq_init=1 dq_init=1,walk_shift=2 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    pack_results ;;
esac
