#!/usr/bin/env bash
# Session 15's device calls (prepared in session 14 on branch next/post-tiled, not yet run):
# A = the sm90 backward's own postprocess, reading the tiled dQ_acc in its staging order (a warp reads 512
# contiguous bytes; session 13's read 8-byte pieces 16 bytes apart, 72 µs a step for 201 MB): the backward's smoke
# cases, the backward / deterministic / captured-gradient suites (dq poisoned: a missed element fails), the step
# kernel by kernel (bwd_post against session 13's 70.3-72.6 µs), the anchors' training steps beside flex and cuDNN.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    python scripts/sanitize_case.py --build --backward > "$R/build.log" 2>&1
    timeout 50 python scripts/sanitize_case.py --backward > "$R/smoke.log" 2>&1
    tail -n 2 "$R/smoke.log"
    grep -q "SANITIZE CASES DONE ok" "$R/smoke.log" || exit 1
    run_tests bwd 100 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_captured_grads_gpu.py
    timeout 60 python scripts/step_kernel_times.py --variants causal full --windows 1024 --no-flex 2>&1 \
      | tee "$R/step_kernel_times.md" | grep -vE "^\| .* \| triton_"
    timeout 210 python benchmarks/bench_training.py --out "$R" 2>&1 | grep -E "^\||rror" ;;
esac
