#!/usr/bin/env bash
# Session 16's first device call, prepared at the end of session 15 (whose device time ran out):
# A = the FP8 suite on the mended tree (session 15's round I failed 25 of its 30 tests on a Python NameError after the
# kernel had run; mended with a CPU test), the decode suite (its libraries speak ABI 4 since session 15, not yet run
# on the GPU), and bench_fp8.py on the FP8 ladder's final first rung (session 15's figure came from a build with
# every 4th exponential on the FMA pipe). B-F: written during session 16, each after the round before it.
# Tile specs of scripts/fp8_tile_sweep.py are relative to the FP8 ladder's first rung as it stood in that round: B and
# C BK 192 with pingpong, unpinned (threshold 8 in B, 0 in C); D and E BK 192 pinned, no pingpong, threshold 0.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests fp8 90 tests/gpu/test_fp8_gpu.py
    run_tests decode 150 tests/gpu/test_decode_gpu.py
    timeout 150 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!" ;;
  B)  # FP8 at BK 192 (V^T in 64-byte swizzle columns; the ladder's new first rung: tile spec "2") against BK 128
      # ("2-bk128"), at 3 stages ("3") and without pingpong ("2-nopp"), kernel alone; the FP8 suite on the new ladder
      # (BK 192 where ptxas fits it, 128 where not); bench_fp8; the decode suite (round A's ran out of time building a
      # library per (variant, head dim) case one at a time: 4 workers here)
    timeout 150 python scripts/fp8_tile_sweep.py --variants full,causal --tiles 2-bk128,2,3,2-nopp \
      2>&1 | tee "$R/fp8_tile_sweep.md" | grep -E "^\||rror|!!"
    run_tests fp8 100 tests/gpu/test_fp8_gpu.py
    timeout 120 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    run_tests decode 220 -n 4 tests/gpu/test_decode_gpu.py ;;
  C)  # FP8 rescale threshold 0 with P offset 8 (the row max's weight exact in e4m3; round B's stale max failed the
      # ALiBi case at BK 192) against threshold 8, with and without pingpong, beside round A's shipped BK 128; the FP8
      # suite and bench_fp8 on the new ladder (BK 192, threshold 0, pingpong)
    timeout 200 python scripts/fp8_tile_sweep.py --variants full,causal --tiles 2-bk128-rt8,2,2-nopp,2-rt8,2-rt8-nopp \
      2>&1 | tee "$R/fp8_tile_sweep.md" | grep -E "^\||rror|!!"
    run_tests fp8 100 tests/gpu/test_fp8_gpu.py
    timeout 120 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!" ;;
  D)  # FP8: the softmax pinned ahead of the P V wait (in round C's build ptxas put the whole softmax after it, so a
      # warpgroup's softmax never ran under its own P V), with and without pingpong ("2-pp", "2"), against round C's
      # first rung ("2-pp-nopin") and its form without pingpong ("2-nopin"), and threshold 8 pinned ("2-rt8"); the FP8
      # suite and bench_fp8 on the new first rung (BK 192, pinned, no pingpong)
    timeout 200 python scripts/fp8_tile_sweep.py --variants full,causal \
      --tiles 2-pp-nopin,2-nopin,2-pp,2,2-rt8 2>&1 | tee "$R/fp8_tile_sweep.md" | grep -E "^\||rror|!!"
    run_tests fp8 100 tests/gpu/test_fp8_gpu.py
    timeout 120 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!" ;;
  E)  # the V^T kernel as 4 x 4 byte transposes (word reads, byte permutes, 128-byte row stores; was byte reads);
      # the pinned rung at 3 stages; the FP8 suite (the V^T kernel against the torch reference) and bench_fp8 on the
      # ladder of round D; the sm90 forward suite (16-bit: threshold 0 now keeps a max that did not grow, the pinned
      # switch, the TMA encoder's new box argument)
    timeout 120 python scripts/fp8_tile_sweep.py --variants full,causal --tiles 2,3 \
      2>&1 | tee "$R/fp8_tile_sweep.md" | grep -E "^\(|^\||rror|!!"
    run_tests fp8 100 tests/gpu/test_fp8_gpu.py
    timeout 120 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    run_tests sm90 200 tests/gpu/test_kernel_sm90.py ;;
  F)  # the final tree: the FP8 suite (its helpers moved to tests/fp8_cases.py), the sm90 forward suite (round E's ran
      # the pinned kernel in place of the no-pingpong one: their build keys collided); then where the shipped FP8
      # kernel's time goes (full, one warm launch, Nsight Compute's full set; it runs at 41% of the tensor pipe's
      # peak): the next FP8 step's starting data
    run_tests fp8 90 tests/gpu/test_fp8_gpu.py
    run_tests sm90 150 tests/gpu/test_kernel_sm90.py
    ncu_profile fp8 attngen_fwd_kernel 150 full --fp8 ;;
esac
