#!/usr/bin/env bash
# Session 40's device calls (scripts/round_s40.sh X on the H200; results in
# benchmarks/results/<date>-h200-session40/round-X/). Session 40 had no device lent: every round is prepared, none run.
# D: dS^T stored with stmatrix and multiplied as bf16 pairs (Sm90BwdTiles.ds_stmatrix / ds_mul_packed, on no rung;
#    built clean on the CPU; with both, an interior step issues at most 469 instructions where full attention's shipped
#    rung issues 556 and causal's 466 where 516: benchmarks/results/2026-12-04-cpu-session40/): their GPU test against
#    float64 first, then the step A/B'd on full attention's 80-row rung and causal's split rung, 6 rotated rounds,
#    then joules per step beside cuDNN.
# C: the backward, deterministic and autograd suites (the new test among them) and the small cases under memcheck and
#    racecheck on the landed tree (session 38's preprocess, built on the CPU only, has not run on a GPU since).
# B: session 39's prepared round B (scripts/round_s39.sh B): dQ's staging alone, its product alone, half the staged
#    bytes, no fence, the consumers' dS barrier per consumer.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, keep, pack_results
S=split_probs=1
F=$S,block_q=80,ds_from_packed=1,s_ahead=2  # full attention's shipped first rung at head dim 128
case "$1" in
  D)
    run_tests ds 200 -n 8 tests/gpu/test_bwd_gpu.py -k "ds_stores_and_packed_multiply"
    timeout 170 python scripts/bwd_tiles_ab.py --rounds 6 --variants full --set $F $F,ds_stmatrix=1 \
      $F,ds_mul_packed=1 $F,ds_stmatrix=1,ds_mul_packed=1 2>&1 | tee "$R/bwd_full_ab.log" | grep -E "TFLOP|rror|diff"
    timeout 120 python scripts/bwd_tiles_ab.py --rounds 6 --variants causal --set $S $S,ds_stmatrix=1 \
      $S,ds_mul_packed=1 $S,ds_stmatrix=1,ds_mul_packed=1 2>&1 | tee "$R/bwd_causal_ab.log" | grep -E "TFLOP|rror|diff"
    timeout 150 python scripts/step_energy.py --variants full causal --no-flex --rounds 3 \
      --set $F,ds_stmatrix=1,ds_mul_packed=1 $S,ds_stmatrix=1,ds_mul_packed=1 2>&1 \
      | tee "$R/step_energy.log" | grep -E "^\||rror"
    pack_results ;;
  C)
    backward_suites
    pack_results ;;
  B)
    bash scripts/round_s39.sh B ;;  # session 39's round B as it was prepared
esac
