#!/usr/bin/env bash
# Session 27's device calls.
# A: the persistent grids' tails. A simulation of the backward's dynamic deal (kv block fastest, one head after
#    another) puts causal's grid 5.6% over its ideal end (the last head's longest walks among the last tiles taken)
#    and sections of heads, kv block slowest (Sm90BwdTiles.sections, tile_sections.cuh), 0.05%: bwd_tiles_ab.py
#    ladder against sections=1 on causal, ALiBi + causal, the window and the document; then Nsight Compute's SM-active
#    shares of the forward's and backward's main kernels (ncu_tail), shipped and with sections.
# B: round A: sections take causal's backward from 0.942 of its SMs' time active to 0.989 (2598 -> 2480 us) and the
#    document's from 0.908 to 0.942; the window's is 0.966 as shipped. Each section's tiles sorted by their walks'
#    lengths at run time (Sm90BwdTiles.order: the preprocess's first blocks fill AttngenBwdArgs.tile_order, ABI 8):
#    ladder, sections=1 and sections=1,order=1 beside flex on the document, the window and causal; then ncu_tail of
#    the document and the window with both.
# C: round B: sections and order each gain on the document (1.413 -> 1.392 -> 1.383 ms) and the window (1.188 ->
#    1.169 -> 1.163), but causal, whose sorted order is its section order, reads 3.670 with sections and 3.857 with
#    order too. Both on by default now: causal's settings in turn A B A' B' (A', B' the same builds under another
#    name), Nsight Compute's times of the preprocess and the main kernel with and without the order, then the
#    backward, deterministic and autograd suites on the new defaults.
# D: round C: causal's A B A' B' read 3.695 / 3.649 / 3.683 / 3.849 ms (the fourth of each round slow, as session
#    26 saw), and Nsight Compute 2481.7 / 2476.3 us for the main kernel without / with the order, 38.8 / 37.5 us for
#    the preprocess: the order costs causal nothing. The training table on the tree as it lands (bench_training.py:
#    every anchor beside flex and cuDNN SDPA).
# E: the landed backward (sorted sections by default) under compute-sanitizer (memcheck, racecheck: the small
#    backward cases at each head dim), and the backward's remaining suites: captured tensors' gradients, runtime
#    parameters, integrations.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, ncu_profile, ncu_tail
case "$1" in
  A)
    timeout 300 python scripts/bwd_tiles_ab.py --variants causal alibi_causal sliding_window document \
      --set ladder sections=1 2>&1 | tee "$R/bwd_tiles_ab_sections.log" | grep -E "TFLOP|grad at|rror"
    for v in causal document sliding_window; do ncu_tail "$v" 60 "$v" --backward; done
    for v in causal document; do ncu_tail "$v-sections" 60 "$v" --backward --bwd-set sections=1; done
    pack_results ;;
  B)
    timeout 330 python scripts/bwd_tiles_ab.py --flex --variants document sliding_window causal \
      --set ladder sections=1 sections=1,order=1 2>&1 | tee "$R/bwd_tiles_ab_order.log" | grep -E "TFLOP|grad at|flex|rror"
    for v in document sliding_window; do ncu_tail "$v-order" 60 "$v" --backward --bwd-set sections=1,order=1; done
    pack_results ;;
  C)
    timeout 200 python scripts/bwd_tiles_ab.py --variants causal \
      --set order=0 ladder order=0,walk_shift=0 walk_shift=0 2>&1 | tee "$R/bwd_tiles_ab_causal_abab.log" | grep -E "TFLOP|grad at|rror"
    for o in 0 1; do
      python scripts/profile_case.py causal --backward --bwd-set order=$o --build > /dev/null 2>&1
      timeout 60 ncu --clock-control none -k "regex:attngen_bwd_(pre_)?kernel" --launch-skip 2 --launch-count 2 \
        --metrics sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_elapsed.max,gpu__time_duration.sum \
        --csv --page raw python scripts/profile_case.py causal --backward --bwd-set order=$o > "$R/tail-causal-order$o.csv" 2>&1
      python scripts/ncu_tail.py "$R/tail-causal-order$o.csv" "causal order=$o" | tee -a "$R/tail.md"
    done
    run_tests bwd 300 -n 4 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
    pack_results ;;
  D)
    timeout 400 python benchmarks/bench_training.py --out "$R" 2>&1 | tee "$R/training.log" | grep -E "^\||rror"
    pack_results ;;
  E)
    smoke_backward 90 || { pack_results; exit 0; }
    sanitize_backward memcheck 90
    sanitize_backward racecheck 100
    run_tests grads 170 -n 4 tests/gpu/test_captured_grads_gpu.py tests/gpu/test_params_gpu.py \
      tests/gpu/test_integrations_gpu.py
    pack_results ;;
esac
