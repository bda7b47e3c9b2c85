#!/usr/bin/env bash
# Session 25's device calls.
# A: relative score mods' terms staged per warp in shared memory (Sm90Tiles.rel_stage, Sm90BwdTiles.rel_stage; on by
#    default): the small cases (among them a learnable table at hd 64 and 128, a division and a mod with factor and
#    bias from the table) plain, under memcheck and racecheck; then the staged-against-walk tests of the forward
#    (tests/gpu/test_relative_gpu.py) and the backward (relative_walk), the captured-gradient and ALiBi tests.
# B: the forward's staged-against-walk test of a mod with factor and bias from the table (round A: not bit for bit),
#    each setting's error against float64 printed; bwd_tiles_ab.py with flex in the same rounds: the learnable and frozen tables at head dim 128, staged in both
#    kernels, in neither, in the backward only; then bench_training.py on the tables at head dim 128 beside flex.
# C: scripts/rel_stage_diff.py (where the staged and walked forwards differ for the mod with factor and bias from the
#    table, B's failure: pytest-xdist kept its prints); bench_training.py on the tables at head dim 64; bench_forward.py
#    on the division score mod beside flex.
# D: the landed tree: the forward's staged-against-walk tests (a bf16 rounding apart, both against float64), FP8 with a
#    relative table (staged at BK 192), negative table indices, the debug build's bounds checks on a relative table,
#    and the public API's relative variants (bias_table, rel_div).
# E: round D's one failure mended (the test's float64 reference ran on the CPU with the CUDA table): the mod checks'
#    GPU tests, the debug builds' bounds checks among them.
# F: rel_stage_diff.py --probs: the attention weights of the staged and walked forwards of the "both" mod compared
#    element by element (by diagonal, by column in the kv tile, by row in the warp slice).
# G: the forward's staged-against-walk test as it lands (bit for bit where both build on the same rung; F showed the
#    "both" mod's walk builds on another: its first rung spills).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
tables() {  # log head-dim timeout: bench_training.py on the learnable and frozen tables beside flex
  timeout "$3" python benchmarks/bench_training.py --out "$R" --head-dim "$2" --variants relpos_learnable \
    relpos_frozen 2>&1 | tee "$R/$1" | grep -E "^\||rror"
}
case "$1" in
  A)
    smoke_backward 120 || { pack_results; exit 0; }
    sanitize_backward memcheck 90
    sanitize_backward racecheck 130
    run_tests rel 260 -n 4 tests/gpu/test_relative_gpu.py tests/gpu/test_bwd_gpu.py \
      tests/gpu/test_captured_grads_gpu.py -k "relative or captured or alibi"
    pack_results ;;
  B)
    run_tests both 150 -n 2 -s tests/gpu/test_relative_gpu.py -k both
    grep -E "^staged|^max" "$R/tests_both.log"
    timeout 300 python scripts/bwd_tiles_ab.py --flex --variants relpos_learnable relpos_frozen \
      --set rel_stage=1,fwd.rel_stage=1 rel_stage=0,fwd.rel_stage=0 rel_stage=1,fwd.rel_stage=0 2>&1 \
      | tee "$R/bwd_tiles_ab_stage.log" | grep -E "TFLOP|grad|flex ran|rror"
    tables training.log 128 200
    pack_results ;;
  C)
    timeout 100 python scripts/rel_stage_diff.py --head-dim 64 2>&1 | tee "$R/rel_stage_diff.log"
    tables training64.log 64 170
    timeout 200 python benchmarks/bench_forward.py --out "$R" --variants div_score --no-compile-figures 2>&1 | tee "$R/forward.log" \
      | grep -E "^\||rror"
    pack_results ;;
  F)
    timeout 200 python scripts/rel_stage_diff.py --head-dim 64 --probs 2>&1 | grep -v "^attngen" | tee "$R/rel_stage_diff.log"
    pack_results ;;
  G)
    run_tests relfinal 200 -n 4 tests/gpu/test_relative_gpu.py
    pack_results ;;
  E)
    run_tests modchecks 330 -n 4 tests/gpu/test_mod_checks_gpu.py
    pack_results ;;
  D)
    run_tests final 400 -n 4 tests/gpu/test_relative_gpu.py tests/gpu/test_negative_index.py \
      tests/gpu/test_fp8_gpu.py tests/gpu/test_mod_checks_gpu.py tests/gpu/test_gpu_api.py \
      -k "relative or relpos or negative or bias_table or rel_div or linear_bias"
    pack_results ;;
esac
