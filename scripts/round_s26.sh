#!/usr/bin/env bash
# Session 26's device calls.
# A: where the short training steps' time goes on the tree as it stands (aa9c26d): step_kernel_times.py for the
#    document, causal and the window of 1024 beside flex (with the GPU's span per step, so the gaps between kernels
#    show), then Nsight Compute on the backward's preprocess and postprocess (the window's step: they do not depend
#    on the mask).
# B: the host's side of the short steps (round A: the document's GPU waited 198 µs per step between kernels under the
#    profiler, the window's 70, causal's 6): host_overhead.py --profile on the window and the document (GPU time back
#    to back, host time, do_bench, cProfile's top functions); then the document's dQ accumulator zeroed by the
#    preprocess against first stores (session 23: 2.0% apart) and the kernels of a step launched as programmatic
#    dependents (Sm90Tiles.pdl, Sm90BwdTiles.pdl; pdl.cuh), each alone and together, with flex in the same rounds;
#    decode's kernel and combine as programmatic dependents (DecodeTileConfig.pdl), the shipped tiles without and
#    with, twice in turn (decode_tile_sweep.py configs 0 and 3; since the review after round D, config 0 is the shipped
#    tiles with PDL and 3 the same without, so the same command now times them in the other order).
# C: decode's kernel and combine launched as programmatic dependents by default (DecodeTileConfig.pdl; round B: B = 1
#    137.7 -> 137.1 us, B = 8 / 64 level): the decode, KV-cache and Llama-loop (CUDA graph) tests on it; then round B's
#    training A/B again with the settings in turn A B A' B' (A' = A and B' = B under another name), without flex,
#    to tell the programmatic launches' cost from the settings' place in each round.
# D: the tree as it lands (programmatic launches on in decode only; the forward's and backward's launches through
#    pdl.cuh's launch_kernel, plainly; bwd_pre.cuh's launch returning its error to both backward families): the
#    backward (sm90 at hd 64 / 128, sm80 at hd 256), deterministic, autograd and FP8 suites.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, ncu_profile
case "$1" in
  A)
    timeout 200 python scripts/step_kernel_times.py --variants document causal --windows 1024 2>&1 \
      | tee "$R/step_kernel_times.md" | grep -E "^\||rror"
    ncu_profile pre "attngen_bwd_pre" 120 sliding_window --backward
    ncu_profile post "attngen_bwd_post" 120 sliding_window --backward
    pack_results ;;
  B)
    timeout 150 python scripts/host_overhead.py --variants sliding_window document --profile 2>&1 \
      | tee "$R/host_overhead.md" | grep -E "^\||rror"
    timeout 330 python scripts/bwd_tiles_ab.py --flex --variants document sliding_window \
      --set ladder dq_init=0 pdl=1,fwd.pdl=1 dq_init=0,pdl=1,fwd.pdl=1 2>&1 \
      | tee "$R/bwd_tiles_ab_dq_init_pdl.log" | grep -E "TFLOP|grad at|flex ran|rror"
    timeout 100 python scripts/decode_tile_sweep.py --configs 0 3 0 3 2>&1 | tee "$R/decode_pdl.log" | grep -E "TB/s|rror"
    pack_results ;;
  C)
    run_tests decode 230 -n 4 tests/gpu/test_decode_gpu.py tests/gpu/test_llama_decode_gpu.py
    timeout 200 python scripts/bwd_tiles_ab.py --variants sliding_window document \
      --set ladder pdl=1,fwd.pdl=1 walk_shift=0 pdl=1,fwd.pdl=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_tiles_ab_pdl_abab.log" | grep -E "TFLOP|grad at|rror"
    pack_results ;;
  D)
    run_tests landed 290 -n 4 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_autograd_gpu.py tests/gpu/test_fp8_gpu.py
    pack_results ;;
esac
