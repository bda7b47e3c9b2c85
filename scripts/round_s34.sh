#!/usr/bin/env bash
# Session 34's device calls (scripts/round_s34.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session34/round-X/):
# A: each step's S^T issued by the step before (Sm90BwdTiles.s_ahead 1: under dQ's staging, 2: under dQ's product
#    too) and the split's row statistics read ahead of the waits (stats_ahead), on full and causal's split rung, A B C D
#    E A' (A' the first setting's build under another name, walk_shift=0 being the shipped value), bwd_tiles_ab.py.
# B: the GPU test of both switches against each step issuing its own (bit for bit, deterministic mode too, and
#    float64).
# C: A's settings again (s_ahead=2 against the split rung, twice each), then the energy of a training step
#    (step_energy.py: attngen shipped and at s_ahead=2, cuDNN SDPA, flex; joules per step, watts, SM clock) on full and
#    causal. (A's log was lost: B ran in the same call, and its archive leaves out files named results.tgz.) The
#    energy script stopped at its first read: nvidia-smi has no total_energy_consumption query there (exit 2).
# D: the energy of a training step again, the counter read through NVML (or the power samples).
# E: on the landed tree (s_ahead = 2 on the split rung of full attention and half planes; stats_ahead, slower in A,
#    taken out): the backward, deterministic and autograd suites, then the backward's small cases under
#    compute-sanitizer memcheck and racecheck (causal and full cases take the new rung).
#    (E: 123 passed, 2 failed: test_split_probabilities_match_one_pass's "split, dK last" setting, set on the causal
#    ladder's split rung, which now has s_ahead, is refused: the test sets s_ahead=0 there now.)
# F: the two tests E failed, fixed; then bench_training.py, the seven anchors against flex and cuDNN, on the landed
#    tree.
# G: s_ahead = 2 against each step issuing its own on the split rung, full and causal, A B A' B' twice over (two
#    processes), to decide whether the rung keeps it. (It does not: positions 1 and 2 within the spread; the third
#    place of a round read 3-5% slow for either setting, here and in C.)
# H: bench_training.py on the landed tree (the shipped kernels as session 33's, s_ahead on no rung) with each round's
#    order rotated (bench_forward.py rotated: attngen, flex and cuDNN each first, second and third once).
# I: the document anchor (1.2997x flex in H) on its shipped split rung against the staged rung with s_ahead 2, which
#    builds clean at head dim 128 (the staged rung alone spills 12 bytes), and the split rung with s_ahead 2; rounds
#    rotated (bwd_tiles_ab.py).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
case "$1" in
  A)
    S=split_probs=1
    timeout 420 python scripts/bwd_tiles_ab.py --variants full causal --set $S $S,s_ahead=1 $S,s_ahead=2 \
      $S,stats_ahead=1 $S,s_ahead=2,stats_ahead=1 $S,walk_shift=0 2>&1 \
      | tee "$R/bwd_s_ahead.log" | grep -E "TFLOP|grad at|rror"
    pack_results ;;
  B)
    run_tests ahead 300 -n 8 tests/gpu/test_bwd_gpu.py -k scores_ahead
    pack_results ;;
  C)
    S=split_probs=1
    timeout 240 python scripts/bwd_tiles_ab.py --variants full causal --set $S $S,s_ahead=2 $S,walk_shift=0 \
      $S,s_ahead=2,walk_shift=0 2>&1 | tee "$R/bwd_s_ahead_repeat.log" | grep -E "TFLOP|rror"
    timeout 300 python scripts/step_energy.py --variants full causal --set $S,s_ahead=2 --seconds 2 --rounds 3 \
      > "$R/step_energy.md" 2>&1
    grep -E "^\||rror" "$R/step_energy.md"
    pack_results ;;
  D)
    timeout 300 python scripts/step_energy.py --variants full causal --set split_probs=1,s_ahead=2 --seconds 2 \
      --rounds 3 > "$R/step_energy.md" 2>&1
    grep -E "^\||^joules|rror" "$R/step_energy.md"
    pack_results ;;
  E)
    backward_suites
    pack_results ;;
  F)
    run_tests split 150 -n 2 tests/gpu/test_bwd_gpu.py -k split_probabilities_match_one_pass
    training_table 360
    pack_results ;;
  G)
    S=split_probs=1
    for run in 1 2; do
      timeout 200 python scripts/bwd_tiles_ab.py --variants full causal --set $S,s_ahead=0 $S,s_ahead=2 \
        $S,s_ahead=0,walk_shift=0 $S,s_ahead=2,walk_shift=0 2>&1 | tee "$R/bwd_s_ahead_ab$run.log" | grep -E "TFLOP|rror"
    done
    pack_results ;;
  I)
    S=split_probs=1
    timeout 200 python scripts/bwd_tiles_ab.py --flex --variants document --set $S $S,dkv_staged=1,s_ahead=2 \
      $S,s_ahead=2 $S,walk_shift=0 2>&1 | tee "$R/bwd_document_ahead.log" | grep -E "TFLOP|rror"
    pack_results ;;
  H)
    training_table 400
    pack_results ;;
esac
