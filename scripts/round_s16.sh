#!/usr/bin/env bash
# Session 16's first device call, prepared at the end of session 15 (whose device time ran out):
# A = the FP8 suite on the mended tree (session 15's round I failed 25 of its 30 tests on a Python NameError after the
# kernel had run; mended with a CPU test), the decode suite (its libraries speak ABI 4 since session 15, not yet run
# on the GPU), and bench_fp8.py on the FP8 ladder's final first rung (session 15's figure came from a build with
# every 4th exponential on the FMA pipe).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests fp8 90 tests/gpu/test_fp8_gpu.py
    run_tests decode 150 tests/gpu/test_decode_gpu.py
    timeout 150 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!" ;;
esac
