#!/usr/bin/env bash
# Session 8, device round 1: the union-mask walk (e7be5e4). local + global and prefix-LM beside flex, then
# the GPU tests that run union masks (mask zoo, backward).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache ATTNGEN_TEST_BUILD_JOBS=12
R="$OUT"
python benchmarks/bench_forward.py --variants local_global prefix_lm dilated_window causal --no-compile-figures --out "$R" 2>&1 | tee "$R/bench.log" | tail -n 14
ATTNGEN_TEST_FAILURES="$R/failures.txt" timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_mask_zoo_gpu.py tests/gpu/test_bwd_gpu.py 2>&1 | tee "$R/tests.log" | tail -n 8
