#!/usr/bin/env bash
# Session 10's device calls, one step per call (each part cut by `timeout` so that the call returns its logs):
# A = the document variants' first call from the wheel built at f091637 (dist/, carried), then the GPU tests written
# but not run in session 9 (20 training steps beside SDPA, the block summaries run at compile), the integrations
# and the mask zoo; B = the decode kernel (issue 12) against the reference, then beside flex and SDPA, where the
# document variants' first call spends its time, and the integrations again (capture fix in integrations/hf.py);
# C = the decode kernel with packed GQA rows and warps splitting each kv tile, its figures, the integrations and
# the document variants' first call after the wider summary warm-up; D = decode tiles and split counts, then
# compute-sanitizer memcheck / racecheck on the forward, backward and decode kernels; E = the final tree's sm_90a
# wheel (dist/, carried; forward, backward and KV-cache kernels) with nvcc hidden, whether racecheck follows a bulk
# copy's mbarrier at all (scripts/racecheck_bulk_probe.cu), memcheck of forward + backward after prepare_device
# makes the context current before the tensor-map driver calls; F = the probe with the slot reused (write after
# read through the empty barrier), and decode at B = 1 with the 95% split rule; G = the probe released by warp.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    timeout 60 python scripts/prebuilt_check.py dist/attngen_kernels-*.whl --only document document_i32 \
      > "$R/prebuilt_check_document.log" 2>&1
    echo "prebuilt_check rc=$?"; tail -n 25 "$R/prebuilt_check_document.log"
    run_tests new 250 "tests/gpu/test_autograd_gpu.py::test_compiled_transformer_block_trains_like_sdpa" \
      "tests/gpu/test_gpu_api.py::test_compile_runs_the_block_summaries_once" tests/gpu/test_integrations_gpu.py
    run_tests zoo 200 tests/gpu/test_mask_zoo_gpu.py ;;
  B)
    run_tests decode 200 tests/gpu/test_decode_gpu.py
    timeout 190 python benchmarks/bench_decode.py --out "$R" 2>&1 | grep -E "^\||^\[|TB/s|!!"
    timeout 80 python scripts/first_call_profile.py document causal > "$R/first_call_profile.txt" 2>&1
    echo "first_call_profile rc=$?"; grep -E "first call|compile" "$R/first_call_profile.txt"
    run_tests integ 80 tests/gpu/test_integrations_gpu.py ;;
  C)
    run_tests decode 150 tests/gpu/test_decode_gpu.py
    timeout 200 python benchmarks/bench_decode.py --out "$R" 2>&1 | grep -E "^\||^\[|TB/s|!!"
    run_tests integ 100 tests/gpu/test_integrations_gpu.py \
      "tests/gpu/test_gpu_api.py::test_compile_runs_the_block_summaries_once"
    timeout 60 python scripts/first_call_profile.py document > "$R/first_call_profile.txt" 2>&1
    echo "first_call_profile rc=$?"; grep -E "first call|compile" "$R/first_call_profile.txt" ;;
  D)
    timeout 130 python scripts/decode_tile_sweep.py --out "$R" 2>&1 | grep -E "TB/s|!!"
    python scripts/sanitize_case.py --build --backward && python scripts/sanitize_case.py --build --decode
    for tool in memcheck racecheck; do
      timeout 110 compute-sanitizer --tool $tool python scripts/sanitize_case.py --backward > "$R/$tool.log" 2>&1
      echo "$tool fwd+bwd rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hd[0-9]+ |SANITIZE" "$R/$tool.log" | head -8
      timeout 60 compute-sanitizer --tool $tool python scripts/sanitize_case.py --decode > "$R/$tool-decode.log" 2>&1
      echo "$tool decode rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|decode hd|SANITIZE" "$R/$tool-decode.log" | head -6
    done ;;
  E)
    timeout 220 python scripts/prebuilt_check.py dist/attngen_kernels-*.whl > "$R/prebuilt_check.log" 2>&1
    echo "prebuilt_check rc=$?"; grep -vE "^\s*$" "$R/prebuilt_check.log" | tail -n 30
    nvcc -std=c++17 -arch=sm_90a -I attngen/templates scripts/racecheck_bulk_probe.cu -o /tmp/probe \
      && timeout 30 compute-sanitizer --tool racecheck /tmp/probe > "$R/racecheck_probe.log" 2>&1
    echo "racecheck probe rc=$?"; grep -E "probe:|SUMMARY|Race reported" "$R/racecheck_probe.log" | head -4
    python scripts/sanitize_case.py --build --backward > /dev/null 2>&1
    timeout 120 compute-sanitizer --tool memcheck python scripts/sanitize_case.py --backward > "$R/memcheck.log" 2>&1
    echo "memcheck fwd+bwd rc=$?"; grep -E "ERROR SUMMARY|hd[0-9]+ |SANITIZE|building|Program hit" "$R/memcheck.log" | head -12 ;;
  F)
    nvcc -std=c++17 -arch=sm_90a -I attngen/templates scripts/racecheck_bulk_probe.cu -o /tmp/probe \
      && timeout 30 compute-sanitizer --tool racecheck /tmp/probe > "$R/racecheck_probe.log" 2>&1
    echo "racecheck probe rc=$?"; grep -E "probe|SUMMARY|Race reported" "$R/racecheck_probe.log" | head -6
    timeout 120 python benchmarks/bench_decode.py --shapes 1x131072 --variants full softcap --out "$R" 2>&1 \
      | grep -E "^\||TB/s" ;;
  G)
    nvcc -std=c++17 -arch=sm_90a -I attngen/templates scripts/racecheck_bulk_probe.cu -o /tmp/probe \
      && timeout 30 compute-sanitizer --tool racecheck --print-limit 4 /tmp/probe > "$R/racecheck_probe.log" 2>&1
    echo "racecheck probe rc=$?"; grep -E "probe|SUMMARY|Race reported|at probe" "$R/racecheck_probe.log" | head -8 ;;
esac
