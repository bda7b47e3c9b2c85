#!/usr/bin/env bash
# Session 14's device calls, one step per call (each part cut by `timeout` so that the call returns its logs):
# A = dQ converted inside the sm90 backward (the last addition to a chunk of a q-block hands it to a finisher
# warp; the preprocess sets the counters; no postprocess; bwd ABI 6): the racecheck probe with every reader thread
# arriving, the backward's smoke cases, the backward / deterministic / captured-gradient suites, and the anchors'
# training steps beside flex and cuDNN;
# it showed the training steps 0.84-0.98x of session 12's figures: the writers' per-reduction wait, proxy fence
# and atomic round trip (suspected) held the consumers;
# B = the writers count their reductions in batches of 4 (one wait, one fence and one atomic per lane per batch):
# the step kernel by kernel, the Q / dO slot released by every consumer thread (Sm90BwdTiles.release_per_thread)
# beside by warp, the anchors' training steps, the backward suites;
# it showed the backward kernel itself 18-36% slower per visited tile than session 13's (causal 3407.8 µs against
# 2599.4, full 5895.9 against 5008.8, window 1024 1060.0 against 776.7) for a preprocess of 67.7 µs (causal; 76.3
# before) and no postprocess (~72): the fused conversion was taken out again (not understood: the consumers' code
# is the same but for register names), keeping the preprocess's new shape (a block per q-block, a row per 8, 16 or
# 32 lanes) and the slot released by every consumer thread (racecheck-clean in the probe; the A/B: causal -0.7%,
# full +1.4%, window and document within 0.6%);
# (A and B ran on the trees named in the results README; on a later tree B's `release_per_thread` setting no longer
# exists, so B does not run there.)
# C (prepared, not run: the session's device time was spent) = sanitizers and the suites A, B and D did not reach
# (autograd, forward sm90, API, varlen), on whatever tree runs it;
# D = on the final kernel: the backward's smoke cases, racecheck and memcheck, the anchors' training steps beside
# flex and cuDNN, the backward / deterministic / captured-gradient suites.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I attngen/templates scripts/racecheck_bulk_probe.cu \
      -o /tmp/probe && timeout 30 compute-sanitizer --tool racecheck --print-limit 4 /tmp/probe \
      > "$R/racecheck_probe.log" 2>&1
    grep -E "values|RACECHECK SUMMARY|Error" "$R/racecheck_probe.log"
    smoke_backward 60 || exit 1
    run_tests bwd 230 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_captured_grads_gpu.py
    timeout 200 python benchmarks/bench_training.py --out "$R" 2>&1 | grep -E "^\||rror" ;;
  B)
    smoke_backward 60 || exit 1
    timeout 60 python scripts/step_kernel_times.py --variants causal full --windows 1024 --no-flex 2>&1 \
      | tee "$R/step_kernel_times.md" | grep -vE "^\| .* \| triton_"
    timeout 150 python scripts/bwd_tiles_ab.py --set release_per_thread=0 release_per_thread=1 2>&1 \
      | tee "$R/bwd_tiles_ab.log" | grep -v "max |grad"
    timeout 170 python benchmarks/bench_training.py --out "$R" 2>&1 | grep -E "^\||rror"
    run_tests bwd 100 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_captured_grads_gpu.py ;;
  C)
    python scripts/sanitize_case.py --build --backward > "$R/build.log" 2>&1  # outside the sanitizer
    sanitize_backward racecheck 80
    sanitize_backward memcheck 80
    run_tests rest 300 tests/gpu/test_autograd_gpu.py tests/gpu/test_kernel_sm90.py tests/gpu/test_gpu_api.py \
      tests/gpu/test_varlen_gpu.py ;;
  D)
    smoke_backward 50 || exit 1
    sanitize_backward racecheck 70
    sanitize_backward memcheck 60
    timeout 210 python benchmarks/bench_training.py --out "$R" 2>&1 | grep -E "^\||rror"
    run_tests bwd 100 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_captured_grads_gpu.py ;;
esac
