#!/usr/bin/env bash
# Session 44's device calls (scripts/round_s44.sh X on the H200; results in
# benchmarks/results/<date>-h200-session44/round-X/). Session 44 itself got no machine: these wait for the next.
# T [END]: the ladder with dS^T's options and delta early on every split rung (wip/ds-rungs.patch) and lse early too on
#    full attention's 80-row rung (wip/full-lse-early.patch: it builds clean there since session 44), both applied here:
#    the backward suite (148 cases, more kernels than session 38's 156-second run built: up to 300 s), then the
#    backward's small cases plainly and under memcheck, within what is left of END seconds (560).
# W: the training table on every anchor on the same ladder (the next call, while the machine is warm).
# R: the backward's small cases under racecheck on the same ladder (built by T on the warm machine; built again if not).
# The next session's order: T, W, R (the evidence the ladder lands on), then A and C, and P if time is left.
# A: full attention's 80-row rung as shipped, with dS^T's options and delta early (the ladder patch's rung), with lse
#    early too (stats_early 3: full-lse-early.patch's), and each of those two with dQ_acc zeroed by the preprocess
#    (dq_init 0: its writers' first-store flag, an atomic per staged dQ, out of the way: the consumers' wait for the
#    staged-dQ buffer was 3.6% of full's step in session 43's profile), 6 rotated rounds.
# C: causal's split rung as shipped, with dS^T's options and delta early, with lse early too, and beside them full
#    attention's 80-row rung with the three (80 rows spilled on causal-like masks before; with them causal builds clean
#    there), the split rung with dK's product behind dQ's (wip/dk-last.patch, its code applied here: FA4's order, which
#    stages dQ under dK's product; 8.5% of causal's kernel's stall samples were the wait for dQ's product in session
#    43's profile) and with each step's S^T issued a step ahead instead (s_ahead 2, under dQ's product), 6 rotated
#    rounds.
# P [VARIANT [SETTING]]: Nsight Compute's full set on a variant's backward main kernel (full) at a tile setting (full
#    attention's 80-row rung with lse and delta early and dS^T's options; scripts/profile_case.py --bwd-set, dk_last
#    available), to set beside session 43's round G (e.g. `P causal split_probs=1,ds_stmatrix=1,ds_mul_packed=1,
#    stats_early=3,dk_last=1` for causal's best of round C).
# Rounds of scripts/round_s43.sh as prepared there otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
ladder() {  # the ladder under test, in this call's copy of the tree (each call's copy is sent afresh): dS^T's options
  # and delta early on every split rung, lse early too on full attention's 80-row rung
  grep -q "ds_mul_packed=True, stats_early=1)" attngen/jit/tiles.py || git apply wip/ds-rungs.patch || exit 1
  grep -q "s_ahead=2, stats_early=3)" attngen/jit/tiles.py || git apply wip/full-lse-early.patch || exit 1
}
case "$1" in
  T)
    source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward
    end=${2:-560}  # the call's seconds: each step's limit is what is left of them
    left() { echo $(( end - ${1:-0} - SECONDS )); }  # seconds left, less a reserve (the first argument)
    ladder
    run_tests bwd 300 -n 8 tests/gpu/test_bwd_gpu.py
    [ $(left) -gt 90 ] && smoke_backward 40 && sanitize_backward memcheck $(left 5)
    pack_results ;;
  W)
    source scripts/device_step.sh  # environment, $R, training_table
    ladder
    training_table 330
    pack_results ;;
  R)
    source scripts/device_step.sh
    ladder
    smoke_backward 60 && sanitize_backward racecheck 240
    pack_results ;;
  A|C)
    source scripts/device_step.sh
    grep -q "dk_last" attngen/jit/tiles.py || git apply --exclude='tests/*' wip/dk-last.patch || exit 1
    S=split_probs=1
    F=$S,block_q=80,ds_from_packed=1,s_ahead=2  # full attention's shipped first rung at head dim 128
    B=ds_stmatrix=1,ds_mul_packed=1
    if [ "$1" = A ]; then
      timeout 560 python scripts/bwd_tiles_ab.py --rounds 6 --variants full --set $F $F,$B,stats_early=1 \
        $F,$B,stats_early=3 $F,$B,stats_early=1,dq_init=0 $F,$B,stats_early=3,dq_init=0 2>&1 \
        | tee "$R/bwd_full_ab.log" | grep -E "TFLOP|rror|diff"
    else
      timeout 560 python scripts/bwd_tiles_ab.py --rounds 6 --variants causal --set $S $S,$B,stats_early=1 \
        $S,$B,stats_early=3 $F,$B,stats_early=3 $S,$B,stats_early=3,dk_last=1 $S,$B,stats_early=3,s_ahead=2 2>&1 \
        | tee "$R/bwd_causal_ab.log" | grep -E "TFLOP|rror|diff"
    fi
    pack_results ;;
  P)
    source scripts/device_step.sh  # environment, $R, ncu_profile, pack_results
    grep -q "dk_last" attngen/jit/tiles.py || git apply --exclude='tests/*' wip/dk-last.patch || exit 1
    m=${2:-full}
    tiles=${3:-split_probs=1,block_q=80,ds_from_packed=1,s_ahead=2,ds_stmatrix=1,ds_mul_packed=1,stats_early=3}
    ncu_profile "bwd-$m-early" attngen_bwd_kernel 240 "$m" --backward --bwd-set "$tiles"
    pack_results ;;
  *) bash scripts/round_s43.sh "$@" ;;
esac
