#!/usr/bin/env bash
# Prepared in session 31 for the next session's device calls (not yet run): the backward's staged dK / dV against its
# register stores, then the training table on the staged forward. Session 31 ran the whole GPU suite on 89e7dfd
# (dkv_staged's test against the register stores passed) and had no device time left for these.
# A: the backward with dK and dV staged for TMA stores (Sm90BwdTiles.dkv_staged) beside the register stores and flex,
#    on the window, causal, the document and full (bwd_tiles_ab.py, A B A' B': the last two the same builds under other
#    names, walk_shift=0 being the shipped value), gradients compared with the first setting's.
# B: bench_training.py (every anchor, attngen, flex and cuDNN SDPA in one process): the training table after session
#    30's staged forward epilogue (and with dkv_staged where A turns it on).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
case "$1" in
  A)
    timeout 400 python scripts/bwd_tiles_ab.py --flex --variants sliding_window causal document full \
      --set dkv_staged=0 dkv_staged=1 dkv_staged=0,walk_shift=0 dkv_staged=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_tiles_ab_dkv_staged.log" | grep -E "TFLOP|grad at|flex|rror"
    pack_results ;;
  B)
    timeout 400 python benchmarks/bench_training.py --out "$R" > "$R/training.log" 2>&1
    grep -E "^\||rror" "$R/training.log"
    pack_results ;;
esac
