#!/usr/bin/env bash
# Session 38's device calls (scripts/round_s38.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session38/round-X/):
# A: dQ added from the consumers' registers (Sm90BwdTiles.dq_red, never run on a GPU): its GPU test, the backward's
#    small cases with it plainly and under memcheck; full and causal on the split rung with and without it, 4 rotated
#    rounds.
#    (A: 10 passed; the small cases ok, memcheck 0 errors; full 7.012 / 7.106 ms, causal 3.780 / 3.632: within the
#    rounds' spread.)
# B: the same settings and with s_ahead 2 as well: energy per step (step_energy.py, beside the shipped ladder and
#    cuDNN), 6 rotated rounds of full and causal; the window's staged rung with and without it; the learnable
#    relative-position table against flex (issue 11's point, last measured in session 25).
#    (B: dq_red alone slower and costlier (full 6.907 -> 7.116 ms, 4.806 -> 4.966 J), with s_ahead 2 level; taken out,
#    ../benchmarks/results/2026-12-04-cpu-session38/dq_red_not_kept.patch. The learnable table 2.22x flex.)
# C: 80 q rows per step with dS^T from P^T as packed for dV's product (Sm90BwdTiles.ds_from_packed), which builds
#    full attention's split rung at 80 rows clean (128 bytes spilled before): the 80-row test against float64 with it
#    and without; full attention's energy per step and 6 rotated rounds, 64 rows against 80 (plain, s_ahead 2, dK
#    last).
#    (C: 14 passed; 80 rows 6.847 ms, with s_ahead 2 6.775, with dK last 6.809 against 64 rows' 6.976 (every round of
#    the 80-row settings below 64 rows' median); 4.63-4.64 J against 4.78.)
# D: full attention's ladder at head dim 128 first tries 80 rows, ds_from_packed, s_ahead 2: the backward,
#    deterministic and autograd suites, the small cases plainly and under memcheck and racecheck (the full hd128 case
#    on that rung); bench_training.py on full and causal beside flex and cuDNN.
#    (D: 149 passed, 1 failed: test_dq_pair_matches_unpaired[full-128] set dq_pair on the 80-row rung, which pairs
#    refuse (a test setting, not the kernel); memcheck 0 errors, racecheck 0 hazards; full 569.6 TFLOP/s (1.34x flex,
#    1.04x cuDNN), causal 537.2 (1.42x, 1.07x).)
# E: that test again, pairs against unpaired at 64 q rows.
#    (E: 2 passed.)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, keep, pack_results
S=split_probs=1
case "$1" in
  A)
    run_tests dq_red 220 -n 8 tests/gpu/test_bwd_gpu.py -k "dq_red"
    for v in full causal; do
      timeout 100 python scripts/bwd_tiles_ab.py --rounds 4 --variants $v --set $S $S,dq_red=1 2>&1 \
        | tee "$R/bwd_red_$v.log" | grep -E "TFLOP|rror"
    done
    smoke_backward 50 --set dq_red=1 && sanitize_backward memcheck 90 --set dq_red=1; keep red
    pack_results ;;
  B)
    timeout 130 python scripts/step_energy.py --no-flex --variants full causal --set $S $S,dq_red=1 \
      $S,dq_red=1,s_ahead=2 > "$R/energy.log" 2>&1; grep -E "^\||rror" "$R/energy.log"
    for v in full causal; do
      timeout 100 python scripts/bwd_tiles_ab.py --rounds 6 --variants $v --set $S $S,dq_red=1 $S,dq_red=1,s_ahead=2 \
        2>&1 | tee "$R/bwd_red_$v.log" | grep -E "TFLOP|rror"
    done
    W=$S,dkv_staged=1,s_ahead=2
    timeout 70 python scripts/bwd_tiles_ab.py --rounds 4 --variants sliding_window --set $W $W,dq_red=1 2>&1 \
      | tee "$R/bwd_red_window.log" | grep -E "TFLOP|rror"
    timeout 150 python benchmarks/bench_training.py --out "$R" --variants relpos_learnable relpos_frozen \
      > "$R/training.log" 2>&1; grep -E "^\||rror" "$R/training.log"
    pack_results ;;
  C)
    run_tests bq80 220 -n 8 tests/gpu/test_bwd_gpu.py -k "block_q_80"
    E=$S,block_q=80,ds_from_packed=1
    timeout 130 python scripts/step_energy.py --no-flex --variants full --set $S $E $E,s_ahead=2 $E,dk_last=1 \
      > "$R/energy.log" 2>&1; grep -E "^\||rror" "$R/energy.log"
    timeout 140 python scripts/bwd_tiles_ab.py --rounds 6 --variants full --set $S $E $E,s_ahead=2 $E,dk_last=1 \
      2>&1 | tee "$R/bwd_bq80_full.log" | grep -E "TFLOP|rror"
    pack_results ;;
  D)
    backward_suites
    timeout 100 python benchmarks/bench_training.py --out "$R" --variants full causal > "$R/training.log" 2>&1
    grep -E "^\||rror" "$R/training.log"
    pack_results ;;
  E)
    run_tests pairs 150 -n 4 tests/gpu/test_bwd_gpu.py -k "dq_pair_matches_unpaired and full"
    pack_results ;;
esac
