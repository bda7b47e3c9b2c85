#!/usr/bin/env bash
# Session 28's device calls. Rounds A and C ran on the tree of wip/dq-convert.patch (the Sm90BwdTiles.dq_convert
# field C sets exists only there); B did not run (two refusals took the device time it needed).
# A: dQ converted by each chunk's last writer in the sm90 backward's main kernel (Sm90BwdTiles.dq_convert, backward
#    ABI 9: the preprocess counts the walks visiting each q-block into dq_chunks, the writers count themselves down;
#    no postprocess). The small backward cases (smoke), the backward, deterministic and autograd suites (among them
#    test_dq_converted_by_its_last_writer_matches_the_postprocess), then compute-sanitizer memcheck and racecheck.
#    Three runs (round-A, -A2, -A3): the first stopped at the smoke cases (an unspecified launch failure: the
#    dq_loaded mbarriers were never initialized); in the second the test's document case called launch.backward
#    without the mask's captured ids (an illegal address that took its pytest worker's later tests with it) and
#    racecheck paired the converting lanes' reads with the next reload (only lane 0 arrived on dq_empty); for the
#    third every writer lane arrives and the document case runs through autograd.
# C: round A3: 114 passed, memcheck 0 errors, but racecheck still paired the last writer's reload and the converting
#    lanes' reads with the consumer's staging stores (dq_full had one arrival per consumer warp after a __syncwarp,
#    an order racecheck does not follow). Every consumer thread now arrives on dq_full. The small cases under
#    racecheck (cases 0 and 1, one per head dim: two refusals left the time for no more), then the switch beside flex
#    on the window and causal (A B A' B').
# B: the training table on the new default (bench_training.py: every anchor beside flex and cuDNN SDPA), then the
#    switch alone on the window beside flex (bwd_tiles_ab.py, dq_convert=0 against the shipped ladder, A B A' B'),
#    then the decode rows issue 12 misses with the harness's own ceilings at each row's bytes (bench_decode.py: a
#    device copy and a sum of the same bytes, one CUDA graph each, timed as the kernels are).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
case "$1" in
  A)
    smoke_backward 90 || { pack_results; exit 0; }
    run_tests bwd 330 -n 4 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    sanitize_backward memcheck 70
    sanitize_backward racecheck 130
    pack_results ;;
  B)
    timeout 330 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror"
    timeout 110 python scripts/bwd_tiles_ab.py --flex --variants sliding_window \
      --set dq_convert=0 ladder dq_convert=0,walk_shift=0 walk_shift=0 2>&1 | tee "$R/bwd_tiles_ab_convert.log" \
      | grep -E "TFLOP|grad at|flex|rror"
    timeout 130 python benchmarks/bench_decode.py --out "$R" --variants full sliding_window \
      --shapes 8x32768 1x131072 2>&1 | tee "$R/decode.log" | grep -E "^\||rror"
    pack_results ;;
  C)
    # the small backward cases of head dims 64 and 128 (sanitize_case.py's 0, 1: softcap + causal; a document mask,
    # its last q-block part-filled), built, run, then under racecheck
    python scripts/sanitize_case.py --build --backward --cases 0 1 > "$R/build.log" 2>&1
    timeout 60 python scripts/sanitize_case.py --backward --cases 0 1 > "$R/smoke.log" 2>&1
    tail -n 3 "$R/smoke.log"
    timeout 90 compute-sanitizer --tool racecheck --print-limit 20 python scripts/sanitize_case.py --backward \
      --cases 0 1 > "$R/racecheck.log" 2>&1
    echo "racecheck rc=$?"; grep -E "^========= (Error|RACECHECK|ERROR SUMMARY)|SANITIZE" "$R/racecheck.log" | head -n 8
    timeout 130 python scripts/bwd_tiles_ab.py --flex --variants sliding_window causal \
      --set dq_convert=0 ladder dq_convert=0,walk_shift=0 walk_shift=0 2>&1 | tee "$R/bwd_tiles_ab_convert.log" \
      | grep -E "TFLOP|grad at|flex|rror"
    pack_results ;;
esac
