#!/usr/bin/env bash
# Session 32's device calls, as they ran (scripts/round_s32.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session32/round-X/):
# A: the backward with dK and dV staged for TMA stores (Sm90BwdTiles.dkv_staged) beside the register stores and flex,
#    on the window, causal, the document and full (bwd_tiles_ab.py, A B A' B': the last two the same builds under other
#    names, walk_shift=0 being the shipped value). Its settings are single rungs on the one-pass tiles, not the shipped
#    split rung: B compares the rungs the ladder takes.
# B: the shipped rungs against the staged ones, A B C D then the same builds under other names: the window and the
#    document (shipped: split) and prefix-LM (shipped: one pass, its split rung spilling) at head dim 128, then the
#    window and the document at 64. (As run in session 32, B began with bench_training.py on an intermediate ladder
#    whose archive the second pack_results overwrote; F is the training table on the landed ladder.)
# E: on the landed ladder (jit/tiles.py sm90_bwd_ladder: split + staged as the first rung of a mask other than a half
#    plane without a score_mod): the backward suites; the backward's small cases, two of which take the staged rung,
#    under memcheck and racecheck; the window at head dim 64 again (its 60 s limit ended it while building).
# F: bench_training.py (every anchor, attngen, flex and cuDNN SDPA in one process), then E's window at head dim 64.
# G: causal and full, split against split + staged (A's one-pass rungs were not what they ship), A B A' B'.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
window_hd64() {  # limit: the window at head dim 64, split against split + staged, A B A' B'
  timeout "$1" python scripts/bwd_tiles_ab.py --flex --head-dim 64 --variants sliding_window \
    --set split_probs=1 split_probs=1,dkv_staged=1 split_probs=1,walk_shift=0 split_probs=1,dkv_staged=1,walk_shift=0 \
    2>&1 | tee "$R/bwd_staged_window_hd64.log" | grep -E "TFLOP|flex:|rror"
}
case "$1" in
  A)
    timeout 400 python scripts/bwd_tiles_ab.py --flex --variants sliding_window causal document full \
      --set dkv_staged=0 dkv_staged=1 dkv_staged=0,walk_shift=0 dkv_staged=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_tiles_ab_dkv_staged.log" | grep -E "TFLOP|grad at|flex|rror"
    pack_results ;;
  B)
    S="split_probs=1 split_probs=1,dkv_staged=1 dkv_staged=1 split_probs=0"
    W="$(for s in $S; do printf '%s,walk_shift=0 ' "$s"; done)"
    timeout 330 python scripts/bwd_tiles_ab.py --flex --variants sliding_window document prefix_lm --set $S $W 2>&1 \
      | tee "$R/bwd_staged_rungs_hd128.log" | grep -E "TFLOP|flex:|rror"
    timeout 200 python scripts/bwd_tiles_ab.py --flex --head-dim 64 --variants sliding_window document \
      --set split_probs=1 split_probs=1,dkv_staged=1 dkv_staged=1 split_probs=1,walk_shift=0 \
      split_probs=1,dkv_staged=1,walk_shift=0 dkv_staged=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_staged_rungs_hd64.log" | grep -E "TFLOP|flex:|rror"
    pack_results ;;
  E)
    run_tests bwd 300 -n 8 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py \
      tests/gpu/test_captured_grads_gpu.py
    smoke_backward 120 && { sanitize_backward memcheck 100; sanitize_backward racecheck 120; }
    window_hd64 60
    pack_results ;;
  F)
    timeout 300 python benchmarks/bench_training.py --out "$R" > "$R/training.log" 2>&1
    grep -E "^\||rror" "$R/training.log"
    window_hd64 130 ;;
  G)
    timeout 300 python scripts/bwd_tiles_ab.py --flex --variants causal full --set split_probs=1 \
      split_probs=1,dkv_staged=1 split_probs=1,walk_shift=0 split_probs=1,dkv_staged=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_split_staged_causal_full.log" | grep -E "TFLOP|flex:|rror" ;;
esac
