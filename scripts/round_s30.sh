#!/usr/bin/env bash
# Session 30's device calls.
# A: where the short forward walks and the causal backward spend their warps' time: Nsight Compute's full set
#    (stall samples per SASS line) on one warm launch of the sliding window's forward and of causal's backward.
#    Refused a machine; not run since (B answered what it was for on the forward).
# B: the forward's O stored with TMA from the tile's Q buffer (Sm90Tiles.o_staged, off by default then; its tests were
#    the o_staged alts that are now o_registers): the sm90 template-path tests on it (persistent and one CTA per
#    tile), then beside the shipped rung in one process (tile_sweep.py, A B A' B': the
#    last two the same builds under other names) on the short and long walks at S = 8192 and at S = 1024 (B = 16).
# C: o_staged on by default: the forward's GPU suites on it, then the A/B on the settings round B did not reach: full
#    (BK 176 on the persistent grid: one Q buffer, so the store's reads are waited for at once), softcap (one CTA per
#    work tile) and head dim 64 (causal's first rung is cross_tile, which keeps O in registers).
# D: bench_forward (attngen, flex, cuDNN SDPA in one process): every anchor and issue 15 variant, then causal at
#    S = 1024 (B = 16) and the head dim 64 anchors.
# E: the forward's GPU suites that round C's time limit cut (it ran the sm90 kernel suite, 174 passed, and stopped in
#    the API suite), the builds of round C still in the machine's cache when it is warm.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, ncu_profile, pack_results
case "$1" in
  A)
    ncu_profile window-fwd "attngen_fwd_kernel" 200 sliding_window
    ncu_profile causal-bwd "attngen_bwd_kernel" 200 causal --backward
    pack_results ;;
  B)
    run_tests ost 240 tests/gpu/test_kernel_sm90.py -k "template_paths and (o_staged or persistent or cross)"
    T=128x2-pers-rt8,128x2-pers-rt8-ost,128x2-pers-rt8-again,128x2-pers-rt8-ost-again
    timeout 150 python scripts/tile_sweep.py --variants sliding_window,causal,document,alibi_causal --tiles $T \
      > "$R/tile_sweep_ost.md" 2>&1; grep -E "^\||rror|fail" "$R/tile_sweep_ost.md"
    timeout 100 python scripts/tile_sweep.py --S 1024 --B 16 --variants causal,sliding_window --tiles $T \
      > "$R/tile_sweep_ost_s1024.md" 2>&1; grep -E "^\||rror|fail" "$R/tile_sweep_ost_s1024.md"
    pack_results ;;
  C)
    run_tests fwd 330 -n 4 tests/gpu/test_kernel_sm90.py tests/gpu/test_gpu_api.py tests/gpu/test_mask_zoo_gpu.py \
      tests/gpu/test_varlen_gpu.py tests/gpu/test_negative_index.py tests/gpu/test_relative_gpu.py \
      tests/gpu/test_autograd_gpu.py
    timeout 80 python scripts/tile_sweep.py --variants full \
      --tiles 176x2-pers-rt8,176x2-pers-rt8-ost,176x2-pers-rt8-again,176x2-pers-rt8-ost-again \
      > "$R/tile_sweep_ost_full.md" 2>&1; grep -E "^\||rror|fail" "$R/tile_sweep_ost_full.md"
    timeout 60 python scripts/tile_sweep.py --variants softcap \
      --tiles 128x2-rt8,128x2-rt8-ost,128x2-rt8-again,128x2-rt8-ost-again \
      > "$R/tile_sweep_ost_softcap.md" 2>&1; grep -E "^\||rror|fail" "$R/tile_sweep_ost_softcap.md"
    timeout 80 python scripts/tile_sweep.py --D 64 --variants causal,sliding_window \
      --tiles 128x3-pers-rt8-cross,128x3-pers-rt8-ost,128x3-pers-rt8-cross-again,128x3-pers-rt8-ost-again \
      > "$R/tile_sweep_ost_d64.md" 2>&1; grep -E "^\||rror|fail" "$R/tile_sweep_ost_d64.md"
    pack_results ;;
  D)
    timeout 340 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants full causal sliding_window \
      softcap softcap_causal alibi_causal document document_cuts prefix_lm dilated_window div_score head_scale \
      document_unsorted local_global 2>&1 | tee "$R/bench.log" | grep -E "^\||rror" | tail -n 18
    timeout 60 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal --seq 1024 \
      --batch 16 2>&1 | tee "$R/bench-s1024.log" | grep -E "^\||rror" | tail -n 3
    timeout 80 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal full sliding_window \
      --head-dim 64 2>&1 | tee "$R/bench-d64.log" | grep -E "^\||rror" | tail -n 5
    pack_results ;;
  E)
    run_tests fwd2 540 -n 4 tests/gpu/test_gpu_api.py tests/gpu/test_autograd_gpu.py tests/gpu/test_negative_index.py \
      tests/gpu/test_varlen_gpu.py tests/gpu/test_relative_gpu.py tests/gpu/test_mask_zoo_gpu.py
    pack_results ;;
esac
