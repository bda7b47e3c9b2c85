#!/usr/bin/env bash
# Session 43's device calls (scripts/round_s43.sh X on the H200; results in
# benchmarks/results/<date>-h200-session43/round-X/).
# D: session 40's round D without its joules (the call limit is 600 s; D's four timeouts summed 640): FA4's first
#    archive unpacked when the call carries it (carry [".fa4/a.tar.xz"]), the dS^T options' GPU test against float64,
#    then their step A/B'd on full attention's 80-row rung and causal's split rung, 6 rotated rounds.
# S: the row statistics read early (Sm90BwdTiles.stats_early: 1 delta before dV's issue, 2 lse before dP^T's, 3 both):
#    their GPU test against float64, then the step A/B'd on full attention's 80-row rung (delta only: lse early spills
#    there) and causal's split rung, alone and with dS^T's stmatrix stores / packed multiply, 6 rotated rounds.
# T [END]: the ladder with dS^T's options and delta early on every split rung (wip/ds-rungs.patch, applied here): the
#    backward suite, the training table on every anchor, then the backward's small cases plainly and under memcheck,
#    each within what is left of END seconds (520; racecheck is R, the next call while the machine is warm).
# R: the backward's small cases under racecheck on the same ladder (built by T on the warm machine; built again if not).
# F, G, H, E, C, B: scripts/round_s42.sh's rounds as prepared there (F carries ".fa4/b.tar.xz" while warm).
set -uo pipefail
cd "$(dirname "$0")/.."
case "$1" in
  D)
    [ -f .fa4/a.tar.xz ] && python scripts/fa4_pack.py unpack .fa4/a.tar.xz
    source scripts/device_step.sh  # environment, $R, run_tests, pack_results
    S=split_probs=1
    F=$S,block_q=80,ds_from_packed=1,s_ahead=2  # full attention's shipped first rung at head dim 128
    run_tests ds 180 -n 8 tests/gpu/test_bwd_gpu.py -k "ds_stores_and_packed_multiply"
    timeout 170 python scripts/bwd_tiles_ab.py --rounds 6 --variants full --set $F $F,ds_stmatrix=1 \
      $F,ds_mul_packed=1 $F,ds_stmatrix=1,ds_mul_packed=1 2>&1 | tee "$R/bwd_full_ab.log" | grep -E "TFLOP|rror|diff"
    timeout 130 python scripts/bwd_tiles_ab.py --rounds 6 --variants causal --set $S $S,ds_stmatrix=1 \
      $S,ds_mul_packed=1 $S,ds_stmatrix=1,ds_mul_packed=1 2>&1 | tee "$R/bwd_causal_ab.log" | grep -E "TFLOP|rror|diff"
    pack_results ;;
  S)
    source scripts/device_step.sh  # environment, $R, run_tests, pack_results
    S=split_probs=1
    F=$S,block_q=80,ds_from_packed=1,s_ahead=2  # full attention's shipped first rung at head dim 128
    run_tests stats 200 -n 8 tests/gpu/test_bwd_gpu.py -k "statistics_read_early"
    timeout 180 python scripts/bwd_tiles_ab.py --rounds 6 --variants full --set $F $F,stats_early=1 \
      $F,stats_early=1,ds_stmatrix=1,ds_mul_packed=1 $F,ds_stmatrix=1,ds_mul_packed=1 2>&1 \
      | tee "$R/bwd_full_ab.log" | grep -E "TFLOP|rror|diff"
    timeout 150 python scripts/bwd_tiles_ab.py --rounds 6 --variants causal --set $S $S,stats_early=2 \
      $S,stats_early=3,ds_stmatrix=1 $S,stats_early=2,ds_stmatrix=1 2>&1 | tee "$R/bwd_causal_ab.log" \
      | grep -E "TFLOP|rror|diff"
    pack_results ;;
  T)
    source scripts/device_step.sh  # environment, $R, training_table, run_tests, smoke_backward, sanitize_backward
    end=${2:-520}  # the call's seconds: each step's limit is what is left of them
    left() { echo $(( end - ${1:-0} - SECONDS )); }  # seconds left, less a reserve (the first argument)
    # the ladder under test, in this call's copy of the tree (already there once it has landed)
    grep -q "ds_mul_packed=True, stats_early=1)" attngen/jit/tiles.py || git apply wip/ds-rungs.patch || exit 1
    run_tests bwd 170 -n 8 tests/gpu/test_bwd_gpu.py
    training_table $(left 20)
    [ $(left) -gt 90 ] && smoke_backward 40 && sanitize_backward memcheck $(left 5)
    pack_results ;;
  R)
    source scripts/device_step.sh
    # each call's copy of the tree is sent afresh: the ladder under test applied again
    grep -q "ds_mul_packed=True, stats_early=1)" attngen/jit/tiles.py || git apply wip/ds-rungs.patch || exit 1
    smoke_backward 60 && sanitize_backward racecheck 240
    pack_results ;;
  *) bash scripts/round_s42.sh "$@" ;;
esac
