#!/usr/bin/env bash
# Session 12's device calls, one step per call (each part cut by `timeout` so that the call returns its logs):
# A = the sm90 backward's dQ staged in shared memory and added by one bulk reduction per consumer and q-block
# from a writer warp (FA3's dQ path; dQ_acc tiled by q-block): the backward, deterministic, captured-gradient
# and autograd suites, then forward + backward on the anchors beside flex and cuDNN. It hung: setmaxnreg.inc waits
# for registers the producer never handed back (producer 32 + consumers 240 > the CTA's 384 x 168 at entry);
# B = A with the producer's 24 registers (and the writer warps branched off first, which keeps it from spilling),
# behind a small smoke run with a time limit so that a hang costs a minute, not the call;
# C = compute-sanitizer racecheck and memcheck on the backward's small cases (one per head dim), the remaining
# training anchors beside flex, and the deterministic backward's cost on causal; D = C's racecheck hazards mended
# (the staged dQ handed over by mbarriers, not named-barrier arrive / sync; every lane's reads of the row
# statistics before lane 0 releases the slot): racecheck, the backward suites, causal and full again;
# E = the writer's loop ended by a third mbarrier instead of a -1 written to the slot (D's one remaining
# hazard of the dQ hand-over): the small cases, the deterministic suite (the writer's turns), and the other
# suites that run the backward (runtime parameters, the flex drop-in with torch.compile);
# F (prepared, not run: the session's device time was spent) = racecheck on the probe's partial-barrier cases and
# on the final backward, the Q / dO ring at 3 stages beside 2 (scripts/bwd_tiles_ab.py), and the learnable
# relative-position table's step on the staged dQ beside flex.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests bwd 230 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_captured_grads_gpu.py \
      tests/gpu/test_autograd_gpu.py
    timeout 250 python benchmarks/bench_training.py --variants causal full softcap_causal document --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror|kernel_options" ;;
  B)
    smoke_backward 60 || exit 1
    run_tests bwd 210 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_captured_grads_gpu.py \
      tests/gpu/test_autograd_gpu.py
    timeout 220 python benchmarks/bench_training.py --variants causal full softcap_causal document --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror|kernel_options" ;;
  C)
    python scripts/sanitize_case.py --build --backward > "$R/build.log" 2>&1
    for tool in racecheck memcheck; do
      timeout 110 compute-sanitizer --tool $tool --print-limit 20 python scripts/sanitize_case.py --backward \
        > "$R/$tool.log" 2>&1
      echo "$tool rc=$?"; tail -n 4 "$R/$tool.log"
    done
    timeout 150 python benchmarks/bench_training.py --variants sliding_window alibi_causal prefix_lm --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror|kernel_options"
    timeout 80 python benchmarks/bench_training.py --deterministic --variants causal --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror|kernel_options" ;;
  D)
    smoke_backward 60 || exit 1
    timeout 100 compute-sanitizer --tool racecheck --print-limit 20 python scripts/sanitize_case.py --backward \
      > "$R/racecheck.log" 2>&1
    echo "racecheck rc=$?"; grep -E "^========= (Error|RACECHECK)" "$R/racecheck.log" | head -n 8
    run_tests bwd 170 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_captured_grads_gpu.py \
      tests/gpu/test_autograd_gpu.py
    timeout 110 python benchmarks/bench_training.py --variants causal full --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror|kernel_options" ;;
  E)
    smoke_backward 60 || exit 1
    run_tests det 110 tests/gpu/test_deterministic_gpu.py "tests/gpu/test_params_gpu.py::test_backward_kernel_takes_the_values" \
      "tests/gpu/test_integrations_gpu.py::test_flex_and_module_on_cuda" ;;
  F)
    nvcc -std=c++17 -arch=sm_90a -I attngen/templates scripts/racecheck_bulk_probe.cu -o /tmp/probe \
      && timeout 30 compute-sanitizer --tool racecheck --print-limit 4 /tmp/probe > "$R/racecheck_probe.log" 2>&1
    grep -E "values|RACECHECK SUMMARY" "$R/racecheck_probe.log"
    python scripts/sanitize_case.py --build --backward > "$R/build.log" 2>&1
    timeout 100 compute-sanitizer --tool racecheck --print-limit 20 python scripts/sanitize_case.py --backward \
      > "$R/racecheck.log" 2>&1
    echo "racecheck rc=$?"; grep -E "^========= (Error|RACECHECK)" "$R/racecheck.log" | head -n 8
    timeout 200 python scripts/bwd_tiles_ab.py --stages 2 3 2>&1 | tee "$R/bwd_tiles_ab.log"
    timeout 120 python benchmarks/bench_training.py --variants relpos_learnable --out "$R" 2>&1 \
      | grep -E "^\[|TFLOP|vs flex|rror|kernel_options" ;;
esac
