#!/usr/bin/env bash
# Session 29's device calls.
# A: the sm90 backward's probabilities split under its products (Sm90BwdTiles.split_probs: P^T while dP^T's product
#    runs, dV's product issued before the wait for dP^T, dS^T under it; the first rung of a variant without
#    score_mod): the new test against one pass, then the switch beside flex on the window, causal, the document and
#    full (bwd_tiles_ab.py, A B A' B': the last two the same builds under other names).
# B: the backward, deterministic and autograd suites on the new ladder (the new test through autograd: A's document
#    cases called launch.backward without the mask's captured ids and block summaries), the small backward cases
#    under memcheck and racecheck (case 1, a document mask, takes the split rung).
# C: the training table (bench_training.py: every anchor beside flex and cuDNN SDPA), then dK's product behind dQ's
#    with the split (Sm90BwdTiles.dk_last: dQ staged while dK's product runs) beside the split alone and flex on the
#    window (A B A' B'). Ran as this command line on a warm machine, its files returned as they were (no archive).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
case "$1" in
  A)
    run_tests split 150 tests/gpu/test_bwd_gpu.py -k split_probabilities
    timeout 330 python scripts/bwd_tiles_ab.py --flex --variants sliding_window causal document full \
      --set split_probs=0 split_probs=1 split_probs=0,walk_shift=0 split_probs=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_tiles_ab_split.log" | grep -E "TFLOP|grad at|flex|rror"
    pack_results ;;
  B)
    smoke_backward 90 || { pack_results; exit 0; }
    run_tests bwd 300 -n 4 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    sanitize_backward memcheck 70
    timeout 100 compute-sanitizer --tool racecheck --print-limit 20 python scripts/sanitize_case.py --backward \
      --cases 0 1 > "$R/racecheck.log" 2>&1
    echo "racecheck rc=$?"; grep -E "^========= (Error|RACECHECK|ERROR SUMMARY)|SANITIZE" "$R/racecheck.log" | head -n 8
    pack_results ;;
  C)
    timeout 370 python benchmarks/bench_training.py --out "$R" > "$R/training.log" 2>&1
    grep -E "^\||rror" "$R/training.log"
    timeout 120 python scripts/bwd_tiles_ab.py --flex --variants sliding_window \
      --set split_probs=1 split_probs=1,dk_last=1 split_probs=1,walk_shift=0 split_probs=1,dk_last=1,walk_shift=0 \
      > "$R/bwd_tiles_ab_dk_last.log" 2>&1
    grep -E "TFLOP|grad at|rror" "$R/bwd_tiles_ab_dk_last.log" ;;
esac
