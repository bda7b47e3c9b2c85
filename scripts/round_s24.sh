#!/usr/bin/env bash
# Session 24's device calls.
# A: the shipped backward (first stores into dQ_acc, dq_init 1; relative score mods walked once per diagonal,
#    rel_walk) under the sanitizers: the small cases (a learnable table's among them) plain, under memcheck and
#    racecheck; then the backward, captured-gradient and deterministic suites (with the rel_walk and dq_buffers tests).
# B: bwd_tiles_ab.py with flex in the same rounds: the learnable and frozen relative-position tables, rel_walk 1
#    against 0; the document and the window, two dQ staging buffers (dq_buffers 2) against one; ALiBi + causal
#    (a linear relative mod, also on the walk), rel_walk 1 against 0.
# C: the walk's diagonal sums paired across lanes (two lanes' sums of one d in one shared atomic) and ALiBi back on
#    score_mod per element: the small cases plain, under memcheck and racecheck, the relative-walk and captured-
#    gradient tests, then bench_training.py on the learnable and frozen tables at head dim 128 beside flex.
# D: where the learnable table's step goes: Nsight Compute on its forward and backward kernels (head dim 128), then
#    bench_training.py on the learnable and frozen tables at head dim 64.
# E: rel_walk 1 against 0 without flex (no compile pause between the settings' rounds): the tables at head dims 64
#    and 128 (the walk's diagonal sums now paired across lanes), and the division score mod (a relative mod whose
#    a(d) is a reciprocal) at 128. (The paired sums turned out slower than round B's walk: taken out.)
# F: the walk as round B ran it (no lane pairing; ALiBi off it): E's A/B again, then bench_training.py on the tables at
#    head dims 128 and 64.
# G: the landed tree (F's kernel) under the sanitizers: the small cases plain, memcheck, racecheck; the captured-gradient,
#    relative-walk and ALiBi tests. (Not run: the device refused twice and the session's time ran out.)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
sanitized() {  # the backward's small cases plainly, then under memcheck and racecheck; false when a plain one fails
  smoke_backward 90 || return 1
  sanitize_backward memcheck 70
  sanitize_backward racecheck 90
}
grad_tests() {  # timeout: the captured-gradient, relative-walk and ALiBi tests
  run_tests grads "$1" -n 4 tests/gpu/test_captured_grads_gpu.py tests/gpu/test_bwd_gpu.py -k \
    "captured or relative_walk or alibi"
}
rel_ab() {  # log head-dim variants...: bwd_tiles_ab.py, the relative walk against score_mod per element
  local log=$1 hd=$2
  shift 2
  timeout 150 python scripts/bwd_tiles_ab.py --head-dim "$hd" --variants "$@" --set rel_walk=1 rel_walk=0 2>&1 \
    | tee "$R/$log" | grep -E "TFLOP|grad"
}
tables() {  # log head-dim timeout: bench_training.py on the learnable and frozen tables beside flex
  timeout "$3" python benchmarks/bench_training.py --out "$R" --head-dim "$2" --variants relpos_learnable \
    relpos_frozen 2>&1 | tee "$R/$1" | grep -E "^\||rror"
}
case "$1" in
  A)
    sanitized || { pack_results; exit 0; }
    run_tests bwd 270 -n 4 tests/gpu/test_bwd_gpu.py tests/gpu/test_captured_grads_gpu.py \
      tests/gpu/test_deterministic_gpu.py
    pack_results ;;
  B)
    timeout 200 python scripts/bwd_tiles_ab.py --flex --variants relpos_learnable relpos_frozen \
      --set rel_walk=1 rel_walk=0 2>&1 | tee "$R/bwd_tiles_ab_rel.log" | grep -E "TFLOP|grad|flex ran"
    timeout 170 python scripts/bwd_tiles_ab.py --flex --variants document sliding_window \
      --set dq_buffers=1 dq_buffers=2 2>&1 | tee "$R/bwd_tiles_ab_dqb.log" | grep -E "TFLOP|grad"
    timeout 90 python scripts/bwd_tiles_ab.py --flex --variants alibi_causal \
      --set rel_walk=1 rel_walk=0 2>&1 | tee "$R/bwd_tiles_ab_alibi.log" | grep -E "TFLOP|grad"
    pack_results ;;
  C)
    sanitized || { pack_results; exit 0; }
    grad_tests 150
    tables training.log 128 220
    pack_results ;;
  D)
    ncu_profile relpos-fwd "attngen_fwd" 120 relpos_learnable --backward
    ncu_profile relpos-bwd "attngen_bwd_kernel" 150 relpos_learnable --backward
    tables training64.log 64 150
    pack_results ;;
  E)
    rel_ab bwd_tiles_ab_rel64.log 64 relpos_frozen relpos_learnable
    rel_ab bwd_tiles_ab_rel128.log 128 relpos_frozen relpos_learnable div_score
    pack_results ;;
  F)
    rel_ab bwd_tiles_ab_rel64.log 64 relpos_frozen relpos_learnable
    rel_ab bwd_tiles_ab_rel128.log 128 relpos_frozen relpos_learnable
    tables training.log 128 200
    tables training64.log 64 150
    pack_results ;;
  G)
    sanitized || { pack_results; exit 0; }
    grad_tests 130
    pack_results ;;
esac
