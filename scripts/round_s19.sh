#!/usr/bin/env bash
# Session 19's device calls.
# A: the sm90 backward's postprocess as a block per q-block (dQ_acc read in its staging order, rows turned in shared
# memory, 16-byte stores along dQ's rows) and the preprocess with every load of a block issued first: the backward's
# smoke cases, its GPU suites (dq poisoned: a misplaced element fails), the step kernel by kernel (bwd_post against
# session 15's 117.5-121.9 us and session 13's 70.3-72.6 us for the same layout), the training anchors beside flex
# and cuDNN (issue 11's bar).
# B: the forward's cross-tile switch (Sm90Tiles.cross_tile: a tile's last P V and the next tile's first Q K^T issued
# together, the epilogue under that Q K^T): the sm90 suite (its new template paths `cross`, `cross_nopp`; the default
# path's consumer loop was restructured around it), then tile sweeps of the shipped rung against it for issue 15's
# open forward points: causal and the sliding window at S = 8192 (0.976x / 0.932x FA4), causal at S = 1024 (B16 H16,
# 0.93x cuDNN), causal at D = 64 (0.985x); then what session 18's last commits left unrun on the GPU (the debug-build
# test of a d-indexed table with a linear bias; the FP8 suite, whose alibi + causal steps its bias with one FFMA).
# (B ran: sm90 suite 170 passed, FP8 30 passed; cross-tile against the shipped rung: causal S = 8192 576.4 vs 588.6,
# window 436.1 vs 437.9, causal S = 1024 406.7 vs 402.0 (cuDNN 410.1), causal D = 64 428.6 vs 416.3 (cuDNN 422.1);
# test_mod_checks_gpu cut at its 60 s while building its first variant.)
# C: cross-tile on for masked variants at head dim 64 (the ladder): full and causal at D = 64 beside cuDNN (issue 15's
# point); the training anchors on the final backward (the tiled postprocess, the preprocess as before); the debug-build
# and math-function checks with the time their builds take.
# (C ran: the D = 64 benchmark cut at 80 s while building its first attngen library (flex's compile ran before it); the
# training anchors, the sliding window 1.437 ms and the document 1.609 against round A's 1.277 / 1.524, the others
# within 2.1%; test_mod_checks_gpu cut at 240 s in its first build, the math-function variant with the cross-tile
# epilogue (on the 2-core machine: past 900 s, 66.7 s without it): cross_tile is off again by default.)
# D: the final tree: the step kernel by kernel for causal, the document and the window (round C's two outliers against
# round A's table), their training rows and full / prefix-LM again, the debug-build and math-function checks.
# (D ran: pre 66.8-67.2 us, post 51.1-51.5 us; training cut at 120 s while building prefix-LM (window 1.03x flex,
# document 1.20x, full 1.307x); test_mod_checks_gpu: the fast-math case passed, the 150 s limit cut the next build.)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    smoke_backward 60 || { pack_results; exit 1; }
    run_tests bwd 150 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_captured_grads_gpu.py
    timeout 80 python scripts/step_kernel_times.py --variants causal full document --windows 1024 --no-flex 2>&1 \
      | tee "$R/step_kernel_times.md" | grep -vE "^\| .* \| triton_|Warn|warn"
    timeout 220 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror"
    pack_results ;;
  B)
    run_tests sm90 240 tests/gpu/test_kernel_sm90.py
    timeout 110 python scripts/tile_sweep.py --variants causal,sliding_window \
      --tiles 128x2-rt8-pers,128x2-rt8-pers-cross,128x2-rt8-pers-nopp-cross 2>&1 \
      | tee "$R/tile_sweep_s8192.md" | grep -E "^\||rror"
    timeout 70 python scripts/tile_sweep.py --variants causal --S 1024 --B 16 \
      --tiles 128x2-rt8-pers,128x2-rt8-pers-cross,128x2-rt8-pers-nopp-cross 2>&1 \
      | tee "$R/tile_sweep_s1024.md" | grep -E "^\||rror"
    timeout 70 python scripts/tile_sweep.py --variants causal --D 64 \
      --tiles 128x3-rt8-pers,128x3-rt8-pers-cross 2>&1 \
      | tee "$R/tile_sweep_d64.md" | grep -E "^\||rror"
    run_tests checks 60 tests/gpu/test_mod_checks_gpu.py
    run_tests fp8 60 tests/gpu/test_fp8_gpu.py
    pack_results ;;
  C)
    timeout 80 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal full --head-dim 64 \
      2>&1 | tee "$R/bench-d64.log" | grep -E "^\||rror" | tail -n 4
    timeout 220 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror"
    run_tests checks 240 tests/gpu/test_mod_checks_gpu.py
    pack_results ;;
  D)
    timeout 70 python scripts/step_kernel_times.py --variants causal document --windows 1024 --no-flex 2>&1 \
      | tee "$R/step_kernel_times.md" | grep -vE "^\| .* \| triton_|Warn|warn"
    timeout 120 python benchmarks/bench_training.py --variants sliding_window document full prefix_lm --out "$R" 2>&1 \
      | tee "$R/training.log" | grep -E "^\||rror"
    run_tests checks 150 tests/gpu/test_mod_checks_gpu.py
    pack_results ;;
esac
