#!/usr/bin/env bash
# Prepared at the end of session 20 (whose device time ran out after its round C2): the checks the persistent sm90
# backward still owes, to run with `git apply wip/persistent-bwd.patch` done first (wip/README.md): the tree that
# adds the producer's arrival on kv_empty after C2 (not yet run on a GPU).
# A: the small cases (sanitize_case.py: a hang shows here), racecheck and memcheck over them (now with a causal case
# whose 144 kv blocks exceed the SMs), the backward suites (the persistent / per-tile comparison with empty walks,
# Lq = 0), the one-process A/B of persistent walks against a CTA per tile at the old registers.
# B: the training anchors whole beside flex and cuDNN, then the host's share of a step through the eager twin.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    smoke_backward 90 || { pack_results; exit 0; }
    sanitize_backward racecheck 150
    sanitize_backward memcheck 100
    run_tests bwd 200 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    timeout 150 python scripts/bwd_tiles_ab.py --variants causal full sliding_window document \
      --set persistent=0,producer_regs=24,consumer_regs=240 ladder 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    pack_results ;;
  B)
    timeout 330 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror"
    timeout 60 python scripts/host_overhead.py --variants sliding_window document 2>&1 \
      | tee "$R/host_overhead.md" | grep -E "^\| "
    pack_results ;;
esac
