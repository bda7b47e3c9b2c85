#!/usr/bin/env bash
# Session 11's device calls, one step per call (each part cut by `timeout` so that the call returns its logs):
# A = session 10's review mends on the GPU (decode tests with the small-pool poisoning and causal append cases,
# the integrations, the API tests incl. the flex drop-in). (The decode kernel did not change since round F; its figures stand.)
# B = captured-tensor gradients summed in the sm90 backward (bwd_grad_sites.cuh): their tests, the backward and
# autograd suites after the template change, the learnable relative-position table and ALiBi slopes beside flex
# (causal as the control), and issue 12's greedy-decoding loop under CUDA graphs (test and benchmark);
# C = the diagonal sums in 4 bank-free copies of shared-memory bins (round B's per-element shared atomics
# collided on one address), the gradient tests again, learnable relpos / ALiBi at D = 128 and at D = 64 (where
# flex's backward fits in shared memory); D = the gradient tests with a per-key bias (a per-query one has zero
# gradient), learnable relpos beside flex retried with smaller tiles, and the frozen table as the control;
# E = the deterministic backward (dQ added in kv-block order, turn counters per q block), its tests, the
# backward, autograd and captured-gradient suites on the final kernel, the training anchors' control rows;
# F = attn.varlen on CUDA (the forward kernel per sequence), opcheck of both ops on the kernels;
# G = the review's mends: unused bins left alone for frozen tensors, score-indexed sites per element.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests decode 200 tests/gpu/test_decode_gpu.py
    run_tests api 220 tests/gpu/test_integrations_gpu.py tests/gpu/test_gpu_api.py tests/gpu/test_negative_index.py ;;
  B)
    run_tests grads 190 tests/gpu/test_captured_grads_gpu.py tests/gpu/test_bwd_gpu.py tests/gpu/test_autograd_gpu.py
    timeout 170 python benchmarks/bench_training.py --variants relpos_learnable alibi_learnable causal --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror"
    run_tests llama 110 -s tests/gpu/test_llama_decode_gpu.py
    timeout 90 python benchmarks/llama_decode.py --out "$R" 2>&1 | tail -n 12 ;;
  C)
    run_tests grads 170 tests/gpu/test_captured_grads_gpu.py tests/gpu/test_autograd_gpu.py
    timeout 120 python benchmarks/bench_training.py --variants relpos_learnable alibi_learnable --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror"
    timeout 150 python benchmarks/bench_training.py --head-dim 64 --variants relpos_learnable full --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror" ;;
  D)
    run_tests grads 120 tests/gpu/test_captured_grads_gpu.py
    timeout 200 python benchmarks/bench_training.py --variants relpos_learnable relpos_frozen alibi_learnable \
      --out "$R" 2>&1 | grep -E "^\[|TFLOP|vs flex|rror|kernel_options"
    timeout 170 python benchmarks/bench_training.py --head-dim 64 --variants relpos_learnable relpos_frozen --out "$R" \
      2>&1 | grep -E "^\[|TFLOP|vs flex|rror|kernel_options" ;;
  E)
    run_tests det 150 -s tests/gpu/test_deterministic_gpu.py
    run_tests bwd 200 tests/gpu/test_bwd_gpu.py tests/gpu/test_autograd_gpu.py tests/gpu/test_captured_grads_gpu.py
    timeout 200 python benchmarks/bench_training.py --variants causal full relpos_learnable --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror|kernel_options" ;;
  F)
    run_tests varlen 200 tests/gpu/test_varlen_gpu.py "tests/gpu/test_autograd_gpu.py::test_opcheck_on_the_kernels" ;;
  G)
    run_tests grads 50 tests/gpu/test_captured_grads_gpu.py ;;
esac
