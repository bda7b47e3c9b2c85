#!/usr/bin/env bash
# Session 36's device calls (scripts/round_s36.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session36/round-X/):
# A: the GPU tests written last session and not yet run (the wait hint against no hint, ids outside the summaries'
#    bound refused); then Sm90BwdTiles.wait_ns against the shipped rung, A B C A' (A' the shipped rung under another
#    name), four rotated rounds: full and causal on the split rung, the document on the staged rung with s_ahead 2.
#    (A: the wait hint's and the bound's tests failed on every captured integer tensor on the GPU: torch's CUDA
#    _assert_async refuses a message of 255 characters or more, and the summaries' check passed a longer one, so the
#    document's calls raised (the landed tree's too); the document's A/B died the same way.)
# B: with the device assert's message shortened: A's tests again; the document's A/B (A B C A'); energy per step with
#    and without the hint (step_energy.py, both hints); the document with int32 and with int64 ids
#    (bench_training.py: document, document_i64).
#    (B: the bound's test passed; the wait hint's document cases hit an illegal address: the test called
#    launch.backward without the variant's captured tensors and summaries, which launch now refuses; test fixed.)
# C: with wait_ns 2000 on every sm90 backward rung: the backward, deterministic and autograd suites (the wait hint's
#    test fixed), the backward's small cases under memcheck and racecheck; the GPU API tests of captured tensors.
#    (C: suites 133 passed, memcheck 0 errors, the API tests 21 passed; racecheck 10 hazards, each between the
#    consumer's write of a tile of -1 into its dQ slot (the end of its walks with the hint) and the writer's read of
#    the slot, though dq_full's arrive / wait orders them as it orders every staging's slot, which racecheck passes.
#    The end no longer writes the slot: dq_done, then dq_full.)
# D: on that tree: the backward's suites and its small cases under memcheck and racecheck; bench_training.py on causal
#    and full (rounds rotated).
#    (D: suites 133 passed, memcheck 0 errors, racecheck 0 hazards; but the step 1.8x slower (causal 6.485 ms, full
#    12.499): the writer's end check after each staging was a try_wait on dq_done, which suspends for its time limit
#    when the phase is not complete, every staging; now a test_wait.)
# E: on that tree: causal's split rung with and without the hint (two rounds); the small cases under racecheck.
#    (E: not run, no device time left; the hint went back to no rung.)
# F, G (prepared for the next session, not run): F the hint's and the kv-block pairs' GPU tests
#    (Sm90BwdTiles.wait_ns, dq_pair), the backward's small cases with pairs and the hint on every rung, plainly and
#    under memcheck and racecheck; G full and causal on the split rung, alone, with pairs, with the hint, with both,
#    4 rotated rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, backward_suites, training_table, pack_results
S=split_probs=1; T=$S,dkv_staged=1,s_ahead=2
case "$1" in
  A)
    run_tests pending 200 -n 8 tests/gpu/test_bwd_gpu.py tests/gpu/test_gpu_api.py -k "wait_hint or summary_bound"
    for v in full causal; do
      timeout 110 python scripts/bwd_tiles_ab.py --rounds 4 --variants $v --set $S $S,wait_ns=100000 \
        $S,wait_ns=2000 $S,walk_shift=0 2>&1 | tee "$R/bwd_wait_$v.log" | grep -E "TFLOP|rror"
    done
    timeout 90 python scripts/bwd_tiles_ab.py --rounds 4 --variants document --set $T $T,wait_ns=100000 \
      $T,wait_ns=2000 $T,walk_shift=0 2>&1 | tee "$R/bwd_wait_document.log" | grep -E "TFLOP|rror"
    pack_results ;;
  B)
    run_tests pending 200 -n 8 tests/gpu/test_bwd_gpu.py tests/gpu/test_gpu_api.py -k "wait_hint or summary_bound"
    timeout 90 python scripts/bwd_tiles_ab.py --rounds 4 --variants document --set $T $T,wait_ns=100000 \
      $T,wait_ns=2000 $T,walk_shift=0 2>&1 | tee "$R/bwd_wait_document.log" | grep -E "TFLOP|rror"
    timeout 200 python scripts/step_energy.py --variants full causal --set $S,wait_ns=2000 $S,wait_ns=100000 --no-flex \
      2>&1 | tee "$R/energy.log" | grep -E "^\||rror"
    timeout 200 python benchmarks/bench_training.py --out "$R" --variants document document_i64 \
      > "$R/training.log" 2>&1; grep -E "^\||rror" "$R/training.log"
    pack_results ;;
  C)
    backward_suites
    run_tests api 150 -n 8 tests/gpu/test_gpu_api.py -k "summary_bound or captured or document or launch"
    pack_results ;;
  D)
    backward_suites
    timeout 130 python benchmarks/bench_training.py --out "$R" --variants causal full > "$R/training.log" 2>&1
    grep -E "^\||rror" "$R/training.log"
    pack_results ;;
  E)
    timeout 60 python scripts/bwd_tiles_ab.py --rounds 2 --variants causal --set $S $S,wait_ns=0 2>&1 \
      | tee "$R/bwd_wait_causal.log" | grep -E "TFLOP|rror"
    smoke_backward 40 && sanitize_backward racecheck 100
    pack_results ;;
  F)
    run_tests pairs 300 -n 8 tests/gpu/test_bwd_gpu.py -k "dq_pair or wait_hint"
    P=(--set dq_pair=1,wait_ns=2000)
    smoke_backward 60 "${P[@]}" && { sanitize_backward memcheck 90 "${P[@]}"; sanitize_backward racecheck 120 "${P[@]}"; }
    pack_results ;;
  G)
    for v in full causal; do
      timeout 120 python scripts/bwd_tiles_ab.py --rounds 4 --variants $v --set $S $S,dq_pair=1 $S,wait_ns=2000 \
        $S,dq_pair=1,wait_ns=2000 2>&1 | tee "$R/bwd_pairs_$v.log" | grep -E "TFLOP|rror"
    done
    pack_results ;;
esac
