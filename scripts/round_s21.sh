#!/usr/bin/env bash
# Session 21: the persistent sm90 backward (a CTA per SM taking kv blocks from a counter; warp 0 walking the Q / dO
# ring with every lane, warp 3's lane loading each tile's K and V), at the landed register split 24 / 240: run with
# `git apply wip/persistent-bwd.patch` done first (wip/README.md).
# A: the small cases (scripts/sanitize_case.py: a hang shows here), the backward suites (the persistent / per-tile
#    comparison with empty walks, Lq = 0, the many-kv-block cases), racecheck over the small cases, four training
#    anchors beside flex and cuDNN.
# B: the one-process A/B of persistent walks against a CTA per kv block, then the landed kernel (bebb6e5) timed the
#    same way in a second process.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    smoke_backward 90 || { pack_results; exit 0; }
    run_tests bwd 200 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    sanitize_backward racecheck 60
    timeout 200 python benchmarks/bench_training.py --variants sliding_window document full causal --out "$R" 2>&1 \
      | tee "$R/training.log" | grep -E "^\||rror"
    pack_results ;;
  B)
    # the new kernel with persistent walks off and on in one process, then the landed kernel (bebb6e5, unpacked from
    # wip/old_bebb6e5.tgz, not committed) in a second process on the same machine
    timeout 130 python scripts/bwd_tiles_ab.py --variants causal sliding_window document full \
      --set persistent=0 ladder 2>&1 | tee "$R/bwd_tiles_ab.log" | grep -E "TFLOP|grad"
    mkdir -p /tmp/old && tar xzf wip/old_bebb6e5.tgz -C /tmp/old
    (cd /tmp/old && ATTNGEN_CACHE_DIR=/tmp/attngen-cache-old PYTHONPATH=/tmp/old timeout 85 python \
      scripts/bwd_tiles_ab.py --variants causal sliding_window document full --set ladder) 2>&1 \
      | tee "$R/bwd_tiles_ab_bebb6e5.log" | grep -E "TFLOP|grad"
    pack_results ;;
esac
