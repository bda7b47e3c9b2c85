#!/usr/bin/env bash
# Session 35's device calls (scripts/round_s35.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session35/round-X/):
# A: bench_forward.py on the training anchors and issue 15's variants with each round's order rotated (the forward
#    tables until now timed attngen first in every round, which session 34 found reads it 1-4% high against flex);
#    causal at S = 1024 (B 16) and causal and full at head dim 64, issue 15's cuDNN points.
# B: the ladder's staged rung (masks other than half planes without a score_mod) with s_ahead 2, against what each
#    variant ships (the document at head dim 128: the split rung; the others: the staged rung), A B A' B' (A', B' the
#    same builds under other names), flex in the same rounds: the document, the window and prefix-LM at head dim 128,
#    the document and the window at 64 (bwd_tiles_ab.py).
# C: on the landed ladder (the staged rung at head dim 128 first with s_ahead 2: the document at 128 now builds it,
#    the window and prefix-LM take it; the staged rung without s_ahead still behind it, taken out after F): the
#    backward, deterministic and autograd suites, then the backward's small cases under compute-sanitizer memcheck and
#    racecheck (the window at head dim 128 takes the new rung).
#    (C: 123 passed, 2 failed: test_split_probabilities_match_one_pass's "split, dK last" setting on the window's and
#    the document's staged rung at 128, which now has s_ahead, is refused: the test sets s_ahead=0 in its settings.)
# D: C's failed test, fixed; then bench_training.py (rounds rotated) on the landed ladder, then the document at head
#    dim 128 on the ladder against its former split rung, A B A' B' and flex in five rotated rounds (each in every
#    place once) (bwd_tiles_ab.py).
# E: one rung under four names (fields at their shipped values: the same tiles, the same build), each its own
#    compiled variant, in four rotated rounds: in B and D the fourth setting, the second name of a rung, read 3-10%
#    slower than the first; full and causal (split rung), the document (staged, s_ahead 2). (E: one kernel's medians
#    spread up to 6% whatever its name: the card's noise.)
# F: bench_training.py again on the landed tree (D's table repeated, rounds rotated).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
case "$1" in
  A)
    timeout 420 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants full causal \
      sliding_window softcap softcap_causal alibi_causal document document_cuts prefix_lm 2>&1 | tee "$R/bench.log" \
      | grep -E "^\||rror" | tail -n 12
    timeout 120 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal --seq 1024 \
      --batch 16 2>&1 | tee "$R/bench-s1024.log" | grep -E "^\||rror" | tail -n 3
    timeout 100 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal full \
      --head-dim 64 2>&1 | tee "$R/bench-d64.log" | grep -E "^\||rror" | tail -n 4
    pack_results ;;
  B)
    S=split_probs=1; T=$S,dkv_staged=1
    ab() {  # name head-dim variant A B
      timeout 150 python scripts/bwd_tiles_ab.py --flex --head-dim $2 --variants $3 --set $4 $5 $4,walk_shift=0 \
        $5,walk_shift=0 2>&1 | tee "$R/bwd_$1.log" | grep -E "TFLOP|rror"
    }
    ab document128 128 document $S $T,s_ahead=2
    ab window128 128 sliding_window $T $T,s_ahead=2
    ab prefix128 128 prefix_lm $T $T,s_ahead=2
    ab document64 64 document $T $T,s_ahead=2
    ab window64 64 sliding_window $T $T,s_ahead=2
    pack_results ;;
  C)
    backward_suites
    pack_results ;;
  D)
    run_tests split 150 -n 4 tests/gpu/test_bwd_gpu.py -k split_probabilities_match_one_pass
    training_table 330
    S=split_probs=1; T=$S,dkv_staged=1,s_ahead=2
    timeout 200 python scripts/bwd_tiles_ab.py --flex --rounds 5 --variants document --set $S $T $S,walk_shift=0 \
      $T,walk_shift=0 2>&1 | tee "$R/bwd_document_ladder.log" | grep -E "TFLOP|rror"
    pack_results ;;
  E)
    S=split_probs=1; T=$S,dkv_staged=1,s_ahead=2
    for v in full causal; do
      timeout 150 python scripts/bwd_tiles_ab.py --rounds 4 --variants $v --set $S $S,walk_shift=0 $S,order=1 \
        $S,sections=1 2>&1 | tee "$R/bwd_names_$v.log" | grep -E "TFLOP|rror"
    done
    timeout 150 python scripts/bwd_tiles_ab.py --rounds 4 --variants document --set $T $T,walk_shift=0 $T,order=1 \
      $T,sections=1 2>&1 | tee "$R/bwd_names_document.log" | grep -E "TFLOP|rror"
    pack_results ;;
  F)
    training_table 300
    pack_results ;;
esac
