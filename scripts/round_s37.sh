#!/usr/bin/env bash
# Session 37's device calls (scripts/round_s37.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session37/round-X/):
# A: the wait hint's and the kv-block pairs' GPU tests (Sm90BwdTiles.wait_ns with its test_wait end, dq_pair, neither
#    run on a GPU before); the backward's small cases with the hint on every rung, plainly and under racecheck; with
#    pairs on every rung, plainly and under memcheck.
#    (A: 18 passed; the hint's cases ok plainly, racecheck reached the last case in its 110 s, no hazard by then;
#    the pairs' cases ok plainly, memcheck 0 errors.)
# B: full and causal on the split rung alone, with pairs, with the hint, with both, 4 rotated rounds; the hint's small
#    cases under racecheck with a longer limit.
#    (B: pairs slower, full 9.040 ms against 7.028, causal 5.979 against 3.579; the hint full 6.782, causal 3.577;
#    the hint's cases under racecheck: 0 hazards.)
# C: with wait_ns 2000 on every rung (SM90_BWD_TILES): the backward, deterministic and autograd suites, the small
#    cases plainly and under memcheck and racecheck.
#    (C: 143 passed, memcheck 0 errors, racecheck 0 hazards.)
# D: on that tree: bench_training.py's table of every anchor.
#    (D: every anchor 1.33x flex or more; causal 538.6 TFLOP/s, full 567.6.)
# E: Nsight Compute's full set on full attention's backward, the split rung with pairs and without (the shipped
#    kernel): where the pairs' time goes (grid, stalls at the exchange's waits).
#    (E: pairs 7.40 ms against 4.62 under the profiler, 66 clusters (132 CTAs); their hottest lines the error barrier
#    behind a GPU-wide MEMBAR per thread and exchange, from each thread's release.cluster arrival.)
# F: the pairs with st.async stores counted on the receiver's mbarrier and one arrival per warp: their GPU test, the
#    small cases, full and causal on the split rung with and without pairs, 4 rotated rounds.
#    (F: 10 passed, the cases ok; full 7.043 / 8.246 ms, causal 3.605 / 5.325: pairs still slower, on no rung.)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, keep, pack_results
S=split_probs=1
case "$1" in
  A)
    run_tests pairs_hint 220 -n 8 tests/gpu/test_bwd_gpu.py -k "dq_pair or wait_hint"
    H=(--set wait_ns=2000)
    smoke_backward 60 "${H[@]}" && sanitize_backward racecheck 110 "${H[@]}"; keep hint
    P=(--set dq_pair=1)
    smoke_backward 60 "${P[@]}" && sanitize_backward memcheck 90 "${P[@]}"; keep pairs
    pack_results ;;
  B)
    for v in full causal; do
      timeout 120 python scripts/bwd_tiles_ab.py --rounds 4 --variants $v --set $S $S,dq_pair=1 $S,wait_ns=2000 \
        $S,dq_pair=1,wait_ns=2000 2>&1 | tee "$R/bwd_pairs_$v.log" | grep -E "TFLOP|rror"
    done
    H=(--set wait_ns=2000)
    smoke_backward 60 "${H[@]}" && sanitize_backward racecheck 200 "${H[@]}"; keep hint
    pack_results ;;
  C)
    backward_suites
    pack_results ;;
  D)
    training_table 330
    pack_results ;;
  E)
    ncu_profile pairs attngen_bwd_kernel 200 full --backward --bwd-set $S,dq_pair=1
    ncu_profile split attngen_bwd_kernel 200 full --backward --bwd-set $S
    pack_results ;;
  F)
    run_tests pairs 120 -n 8 tests/gpu/test_bwd_gpu.py -k "dq_pair"
    smoke_backward 50 --set dq_pair=1; keep pairs
    for v in full causal; do
      timeout 70 python scripts/bwd_tiles_ab.py --rounds 4 --variants $v --set $S $S,dq_pair=1 2>&1 \
        | tee "$R/bwd_pairs_$v.log" | grep -E "TFLOP|rror"
    done
    pack_results ;;
esac
