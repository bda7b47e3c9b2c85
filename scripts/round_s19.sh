#!/usr/bin/env bash
# Session 19's device calls.
# A: the sm90 backward's postprocess as a block per q-block (dQ_acc read in its staging order, rows turned in shared
# memory, 16-byte stores along dQ's rows) and the preprocess with every load of a block issued first: the backward's
# smoke cases, its GPU suites (dq poisoned: a misplaced element fails), the step kernel by kernel (bwd_post against
# session 15's 117.5-121.9 us and session 13's 70.3-72.6 us for the same layout), the training anchors beside flex
# and cuDNN (issue 11's bar).
# B: what session 18's last commits left unrun on the GPU (the debug-build test of a d-indexed table with a linear
# bias, a1cd658's clamp; the FP8 suite, whose alibi + causal now steps its bias with one FFMA), then tile sweeps for
# issue 15's open forward points, each against the shipped rung: causal at S = 1024 (B16 H16, 0.93x cuDNN in session
# 18), causal at D = 64 (0.985x), the sliding window at S = 8192 (0.93x FA4 by flex), causal at S = 8192 (0.976x /
# 0.988x FA4).
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
    run_tests checks 120 tests/gpu/test_mod_checks_gpu.py
    run_tests fp8 120 tests/gpu/test_fp8_gpu.py
    timeout 100 python scripts/tile_sweep.py --variants causal --S 1024 --B 16 \
      --tiles 128x2-rt8-pers,128x3-rt8-pers,96x2-rt8-pers,64x2-rt8-pers,128x2-rt8-pers-nopp 2>&1 \
      | tee "$R/tile_sweep_s1024.md" | grep -E "^\||rror"
    timeout 100 python scripts/tile_sweep.py --variants causal --D 64 \
      --tiles 128x3-rt8-pers,128x2-rt8-pers,96x3-rt8-pers,176x3-rt8-pers,128x3-rt8-pers-nopp 2>&1 \
      | tee "$R/tile_sweep_d64.md" | grep -E "^\||rror"
    timeout 100 python scripts/tile_sweep.py --variants sliding_window,causal \
      --tiles 128x2-rt8-pers,128x3-rt8-pers,96x2-rt8-pers,128x2-rt8-pers-nopp 2>&1 \
      | tee "$R/tile_sweep_s8192.md" | grep -E "^\||rror"
    pack_results ;;
esac
