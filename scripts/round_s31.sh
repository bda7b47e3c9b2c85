#!/usr/bin/env bash
# Session 31's device calls: the whole GPU suite on the landed tree (session 30's forward changes: O staged for a TMA
# store, a union mask's work-tile order in shared memory; the backward's dkv_staged switch, off), split over three
# calls so that each ends inside its limit, and the union masks' forward beside flex and cuDNN SDPA.
# A: bench_forward on the two union masks (prefix-LM, local + global), then the forward kernel suites (sm90, sm80), FP8,
#    code generation and the CUDA reference.
# B: the API, mask zoo, autograd, negative-index, varlen, relative-position and math-function suites.
#    Ran 253 of 262 tests (0 failed) before its 560 s limit: the math-function suite and three relative-position cases
#    (the slowest) were left, for C.
# C: the sm80 kernel suite again (round A: its fixture built the KV-cache unit at the top of the build directory,
#    beside no variant.inc; 123 errors at setup, none at run time), the backward, deterministic, captured-gradient,
#    decode, runtime-parameter, Llama decode and integration suites (test_bwd_gpu.py holds dkv_staged's test against
#    the register stores), then what round B left. Every pytest worker now shares one kernel cache
#    (ATTNGEN_TEST_SHARED_CACHE): A and B built each signature once per worker.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
case "$1" in
  A)
    timeout 120 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants prefix_lm local_global \
      2>&1 | tee "$R/bench.log" | grep -E "^\||rror" | tail -n 6
    run_tests fwd 420 -n 6 tests/gpu/test_kernel_sm90.py tests/gpu/test_kernel_gpu.py tests/gpu/test_fp8_gpu.py \
      tests/gpu/test_codegen_gpu.py tests/gpu/test_reference_cuda.py
    pack_results ;;
  B)
    run_tests api 560 -n 6 tests/gpu/test_gpu_api.py tests/gpu/test_mask_zoo_gpu.py tests/gpu/test_autograd_gpu.py \
      tests/gpu/test_negative_index.py tests/gpu/test_varlen_gpu.py tests/gpu/test_relative_gpu.py \
      tests/gpu/test_mod_checks_gpu.py
    pack_results ;;
  C)
    W=tests/gpu/test_relative_gpu.py::test_staged_relative_terms_match_each_threads_walk
    run_tests rest 380 -n 8 tests/gpu/test_kernel_gpu.py tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_captured_grads_gpu.py tests/gpu/test_decode_gpu.py tests/gpu/test_params_gpu.py \
      tests/gpu/test_llama_decode_gpu.py tests/gpu/test_integrations_gpu.py "$W[both-700-128]" "$W[both-700-64]" \
      "$W[table-700-128]" tests/gpu/test_mod_checks_gpu.py
    pack_results ;;
esac
