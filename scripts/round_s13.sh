#!/usr/bin/env bash
# Session 13's device calls, one step per call (each part cut by `timeout` so that the call returns its logs):
# A = where a training step's time goes, kernel by kernel (scripts/step_kernel_times.py: attngen and flex, the
# sm90 backward's time per visited tile over walks of several lengths), and the backward's Q / dO ring at 3
# stages beside 2 (scripts/bwd_tiles_ab.py).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    timeout 300 python scripts/step_kernel_times.py 2>&1 | tee "$R/step_kernel_times.md" | grep -vE "^\| .* \| triton_" 
    timeout 200 python scripts/bwd_tiles_ab.py --stages 2 3 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -v "^\[.*max |grad" ;;
esac
