#!/usr/bin/env bash
# Session 9's device calls, one step per call (each part cut by `timeout` so that the call returns its logs):
# A = the GPU suites that did not run or failed in session 8's round 4, then runtime parameters against baked
# values over 9 rounds, then local + global beside flex (the ascending q-block order); B = the backward
# kernels (sm80_bwd and the new sm90_bwd) against float64, then forward + backward beside flex and cuDNN; C = a
# profile of the sm90 backward; D = a variant of it (reverted); E = the final tree's wheel, suites and figures;
# F = the document variants' first call from the rebuilt wheel.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests api 340 tests/gpu/test_negative_index.py tests/gpu/test_reference_cuda.py tests/gpu/test_params_gpu.py \
      tests/gpu/test_mod_checks_gpu.py tests/gpu/test_bwd_gpu.py tests/gpu/test_integrations_gpu.py \
      "tests/gpu/test_gpu_api.py::test_captured_tensor_strides" tests/gpu/test_codegen_gpu.py
    timeout 130 python scripts/specialize_ab.py --rounds 9 --out "$R" 2>&1 | tail -n 12
    timeout 70 python benchmarks/bench_forward.py --variants local_global --no-compile-figures --out "$R" \
      2>&1 | grep -E "^\|" ;;
  B)
    run_tests bwd 250 tests/gpu/test_bwd_gpu.py
    timeout 200 python benchmarks/bench_training.py --variants causal softcap_causal --out "$R" 2>&1 | tail -n 12 ;;
  C)
    # where the sm90 backward's time goes (causal, one warm launch), and the portable backward's figure beside it
    python scripts/profile_case.py causal --backward --build
    timeout 200 ncu --clock-control none -k regex:attngen_bwd_kernel --launch-skip 1 --launch-count 1 --set full \
      --import-source no -f -o "$R/ncu-bwd" python scripts/profile_case.py causal --backward > "$R/ncu-bwd.log" 2>&1
    ncu --import "$R/ncu-bwd.ncu-rep" --page details > "$R/ncu-bwd-details.txt" 2>&1
    ncu --import "$R/ncu-bwd.ncu-rep" --page source --csv --print-source sass | gzip > "$R/ncu-bwd-sass.csv.gz"
    rm -f "$R/ncu-bwd.ncu-rep"
    grep -E "Duration|Throughput|Issue Slots Busy|No Eligible|Registers Per|Pipe|L2 Hit|Achieved Occ" "$R/ncu-bwd-details.txt" | head -24
    python scripts/ncu_hot_lines.py "$R/ncu-bwd-sass.csv.gz" --top 25
    timeout 100 python benchmarks/bench_training.py --variants causal --bwd-kernel sm80_bwd --out "$R" 2>&1 | tail -n 4 ;;
  D)
    # (ran on b43b7e3, dQ through shared memory and bulk reductions, reverted since) correctness, then every anchor
    run_tests bwd 150 tests/gpu/test_bwd_gpu.py
    timeout 390 python benchmarks/bench_training.py --out "$R" 2>&1 | grep -E "^\||^\[|vs flex|!!" ;;
  E)
    # the final tree: the sm_90a wheel built on the CPU machine (dist/, carried) with nvcc hidden; the autograd,
    # parameter and integration suites on the sm90 backward; forward + backward on every anchor; the mask zoo
    timeout 110 python scripts/prebuilt_check.py dist/attngen_kernels-*.whl > "$R/prebuilt_check.log" 2>&1
    echo "prebuilt_check rc=$?"; tail -n 20 "$R/prebuilt_check.log"
    run_tests final 150 tests/gpu/test_autograd_gpu.py tests/gpu/test_params_gpu.py tests/gpu/test_integrations_gpu.py
    timeout 215 python benchmarks/bench_training.py --out "$R" 2>&1 | grep -E "^\||!!"
    run_tests zoo 100 tests/gpu/test_mask_zoo_gpu.py ;;
  F)
    # the document variants' first call from the wheel (dist/, carried), after compile started running the block
    # summaries once (torch's lazily loaded kernels)
    timeout 60 python scripts/prebuilt_check.py dist/attngen_kernels-*.whl --only document document_i32 \
      > "$R/prebuilt_check_document.log" 2>&1
    echo "prebuilt_check rc=$?"; cat "$R/prebuilt_check_document.log" ;;
esac
