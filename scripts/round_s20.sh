#!/usr/bin/env bash
# Session 20's first device call, prepared at the end of session 19 (whose device time ran out after round D).
# A: what session 19 left unrun on the final tree: the API GPU suite (the forward's consumer loop was restructured
# around the cross-tile switch; the sm90 and FP8 suites passed on it before 3507490 merged its tail, a change its SASS
# shows as a register renaming), the sm90 suite's new cases (the cross paths
# with a masked variant across tiles) and the backward suite whole (its new one-partial-q-block cases, Lq 33; the
# pre- and postprocess moved between headers after session 19's last round), test_mod_checks_gpu.py whole
# (its math-function builds take about 70 s each; the debug-build checks never ran on session 18's kernels), then the
# training anchors whole (prefix-LM's row was cut in round D) with the step kernel by kernel beside them, to look for
# the window's 328 us outside its kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests checks 180 tests/gpu/test_mod_checks_gpu.py
    run_tests new 180 -k "test_backward or template_paths" tests/gpu/test_bwd_gpu.py tests/gpu/test_kernel_sm90.py
    run_tests api 170 -n 4 tests/gpu/test_gpu_api.py
    pack_results ;;
  B)
    # the host's share of a short step (the window's and document's steps ran 76-328 us past their kernels in
    # session 19, their rounds spread 1.25-1.54 ms while flex's held still), with the custom ops and without
    timeout 130 python scripts/host_overhead.py --variants sliding_window document causal --profile 2>&1 \
      | tee "$R/host_overhead.md" | grep -E "^\| "
    timeout 170 python benchmarks/bench_training.py --variants sliding_window document --out "$R" 2>&1 \
      | tee "$R/training.log" | grep -E "^\||rror"
    run_tests api 230 -n 4 tests/gpu/test_gpu_api.py
    pack_results ;;
  C)
    # the sm90 backward's persistent CTAs (kv blocks from a counter, the next tile's K / V under this one's dK / dV
    # stores; registers 40 / 232 first on its ladder): the small cases (a hang shows here, cut at 90 s), the
    # backward suites, racecheck on the small cases, then persistent against a CTA per tile (the old kernel's
    # registers) and the shipped ladder in one process
    smoke_backward 90 || { pack_results; exit 0; }
    run_tests bwd 200 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    sanitize_backward racecheck 100
    timeout 150 python scripts/bwd_tiles_ab.py --variants causal full sliding_window document \
      --set persistent=0,producer_regs=24,consumer_regs=240 ladder 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    pack_results ;;
  C2)
    # round C hung on the deterministic small case (its dQ writer passed the turn on as 2 (blockIdx.x + 1), the
    # tile's index since the grid became one-dimensional, where the next kv block waits for 2 (j + 1)); fixed: the
    # small cases, racecheck on them, the backward suites, then the two short training steps beside flex
    smoke_backward 90 || { pack_results; exit 0; }
    sanitize_backward racecheck 100
    run_tests bwd 200 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    timeout 130 python benchmarks/bench_training.py --variants sliding_window document --out "$R" 2>&1 \
      | tee "$R/training.log" | grep -E "^\||rror"
    pack_results ;;
  D)
    # the training anchors on the final backward (the short steps first), then the host's share of a step with the
    # custom ops' eager twin and without (the profile in a pass of its own)
    timeout 200 python benchmarks/bench_training.py --variants sliding_window document causal full --out "$R" 2>&1 \
      | tee "$R/training.log" | grep -E "^\||rror"
    timeout 60 python scripts/host_overhead.py --variants sliding_window document 2>&1 \
      | tee "$R/host_overhead.md" | grep -E "^\| "
    pack_results ;;
esac
