#!/usr/bin/env bash
# Session 8's verification calls, one step per device call: A = the kernel suites and the mask zoo, then runtime
# parameters against baked values; B = the API / training / integration / parameter suites, the mask zoo, then
# local + global beside flex; C = the prebuilt wheel with nvcc hidden. Each part is cut by `timeout` so
# that the call returns its logs.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests kernels 400 tests/gpu/test_kernel_gpu.py tests/gpu/test_kernel_sm90.py tests/gpu/test_mask_zoo_gpu.py
    timeout 130 python scripts/specialize_ab.py --out "$R" 2>&1 | tail -n 14 ;;
  B)
    run_tests api 330 tests/gpu/test_autograd_gpu.py tests/gpu/test_gpu_api.py tests/gpu/test_integrations_gpu.py \
      tests/gpu/test_bwd_gpu.py tests/gpu/test_codegen_gpu.py tests/gpu/test_mod_checks_gpu.py \
      tests/gpu/test_negative_index.py tests/gpu/test_reference_cuda.py tests/gpu/test_params_gpu.py
    run_tests zoo 100 tests/gpu/test_mask_zoo_gpu.py
    timeout 70 python benchmarks/bench_forward.py --variants local_global --no-compile-figures --out "$R" \
      2>&1 | grep -E "^\|" ;;
  C)
    # the sm_90a wheel built on the CPU machine (dist/, carried), nvcc hidden
    timeout 110 python scripts/prebuilt_check.py dist/attngen_kernels-*.whl > "$R/prebuilt_check.log" 2>&1
    echo "prebuilt_check rc=$?"; tail -n 22 "$R/prebuilt_check.log" ;;
esac
