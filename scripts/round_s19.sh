#!/usr/bin/env bash
# Session 19's first device call, prepared at the end of session 18 (whose device time ran out after round D).
# A: what session 18's last commits left unrun on the GPU (the debug-build test of a d-indexed table with a linear
# bias, a1cd658's clamp; the FP8 suite, whose alibi + causal now steps its bias with one FFMA), then tile sweeps for
# issue 15's open forward points, each against the shipped rung: causal at S = 1024 (B16 H16, 0.93x cuDNN in session
# 18), causal at D = 64 (0.985x), the sliding window at S = 8192 (0.93x FA4 by flex), causal at S = 8192 (0.976x /
# 0.988x FA4); then the forward + backward anchors (issue 11) on the session-18 forward.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
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
    timeout 200 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror" | tail -n 10
    pack_results ;;
esac
