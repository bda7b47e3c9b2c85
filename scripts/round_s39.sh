#!/usr/bin/env bash
# Session 39's device calls (scripts/round_s39.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session39/round-X/):
# A: where the step's joules go: scripts/bwd_energy_ablation.py (each part of the backward taken out in a copy of the
#    tree, full and causal, step_energy.py beside cuDNN); causal's split rung against s_ahead 2 and against 80 q rows
#    with the packed P^T and s_ahead 2 (built clean on the CPU in session 38, never measured), 6 rotated rounds.
#    (A: taking out the dQ writers' additions saved 5.3% / 5.1% of causal's / full's step; those, the consumers'
#    staging and dQ's product 15.9% / 21.0% (dq_stage lost dQ's product to ptxas as well, so it ran dq_product's
#    kernel); dS^T's stores 1.5% / 1.1%, the exponentials 2.4% / 2.6%, dK's product 7.6% / 7.1%. Causal: split
#    3.569 ms, + s_ahead 2 3.585, 80 rows + packed + s_ahead 2 3.549.)
# B: the staging alone (its stores skipped at run time, dQ's product kept) and dQ's product alone; half the staged
#    bytes (with and without the writers' additions, the latter halved too: the dQ path of a 2-CTA design exchanging
#    dS); no proxy fence after the staging; the consumers' barrier before dQ's product per consumer (the two
#    warpgroups out of step). Each build's HGMMA count printed (an ablation must keep the products it keeps).
#    (B: not run in session 39: the machine stopped answering during the first try, and none was lent after it.)
# C: the backward, deterministic and autograd suites and the small cases under memcheck and racecheck on the landed
#    tree (session 38's preprocess widens bf16 pairs by shifts, built on the CPU only; no kernel changed since).
#    (C: not run in session 39.)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, keep, pack_results
S=split_probs=1
case "$1" in
  A)
    # (its dq_stage then compiled dQ's product out; the script's dq_stage keeps it now)
    timeout 330 python scripts/bwd_energy_ablation.py --variants causal full --work /tmp/ablation \
      --ablations base dq_add dq_stage dq_product ds_store exp dk_product \
      > "$R/ablation.log" 2>&1; grep -E "^\| [a-z_]+ \| (causal|full)|^\[build|rror" "$R/ablation.log"
    timeout 150 python scripts/bwd_tiles_ab.py --rounds 6 --variants causal --set $S $S,s_ahead=2 \
      $S,block_q=80,ds_from_packed=1,s_ahead=2 2>&1 | tee "$R/bwd_causal_ab.log" | grep -E "TFLOP|rror|diff"
    pack_results ;;
  B)
    timeout 420 python scripts/bwd_energy_ablation.py --variants causal full --work /tmp/ablation \
      --ablations base dq_add dq_stage dq_product_only stage_half dq_half stage_nofence ds_bar \
      > "$R/ablation.log" 2>&1; grep -E "^\| [a-z_]+ \| (causal|full)|^\[build|HGMMA|rror" "$R/ablation.log"
    pack_results ;;
  C)
    backward_suites
    pack_results ;;
esac
