#!/usr/bin/env bash
# Session 17's device calls. A: the FP8 forward with V's tiles transposed inside the kernel by three warps of the
# producer warpgroup (fwd_sm90.cuh, transpose_v; prepared at the end of session 16, index arithmetic checked on the
# CPU), so the call makes no V^T copy (0.021 ms of round E's 1.267 ms full call): the FP8 suite, bench_fp8 (the bar:
# >= 1.4x the bf16 figure, end to end), the pinned rung against pingpong and BK 128; then where a decode call's time
# goes (issue 12's 4.0 TB/s bar): kernel by kernel at the three shapes beside SDPA, and Nsight Compute's full set on
# both at B=8 L=32768.
# The sweeps of rounds B-D ran scripts/decode_tile_sweep.py as it stood at each round's commit (its warp_rows and
# kv_copy switches were removed after round F; docs/performance.md, decode).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, ncu_nvtx
case "$1" in
  A)
    run_tests fp8 120 tests/gpu/test_fp8_gpu.py
    timeout 150 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    timeout 100 python scripts/fp8_tile_sweep.py --variants full,causal --tiles 2,2-pp,2-bk128 \
      2>&1 | tee "$R/fp8_tile_sweep.md" | grep -E "^\||rror|!!"
    for s in "8 32768" "64 4096" "1 131072"; do set -- $s
      timeout 60 python scripts/profile_decode.py --B $1 --L $2 2>&1 | tee -a "$R/profile_decode.txt"; done
    ncu_nvtx decode 120 scripts/profile_decode.py --ncu ;;
  B)  # decode after round A's profile (the loader was ~60% of the kernel's instructions; cuDNN's kernel of the same
      # grid streams at 4.56 TB/s to our 4.10): one address per tile for runs of cache rows, no row checks on whole
      # tiles; warp_rows (each warp copies its own rows: no CTA barrier per tile) and an L2 evict-first policy as
      # tile switches; the combine one CTA per row with its warps over the splits; no index kernels in a plain step.
      # The decode suite on warp_rows (the default here), the tile sweep, then bench_decode on the default
    run_tests decode 150 -n 4 tests/gpu/test_decode_gpu.py
    timeout 200 python scripts/decode_tile_sweep.py --out "$R" 2>&1 | tee "$R/decode_tile_sweep.txt" | grep -E "TB/s|rror"
    timeout 60 python scripts/profile_decode.py --B 1 --L 131072 2>&1 | grep -v Warn | tee "$R/profile_decode.txt"
    timeout 200 python benchmarks/bench_decode.py --out "$R" 2>&1 | grep -E "^\||rror|!!" ;;
  C)  # round B: 3.96 / 3.98 / 3.54 TB/s (was 3.81 / 3.86 / 3.42); the kernel alone 4.06 TB/s at B=1 to cuDNN's 4.46
      # with the same grid; evict-first slower. Round A's profile counted 48% more L2 sectors than the bytes read
      # (L2 hit rate 34%, cuDNN's 0.5%): which instructions, and how cuDNN's kernel reads (Nsight Compute source
      # pages of both at B=8); the cp.async forms as tile switches (.ca, .cg with a 256-byte L2 prefetch)
    ncu_nvtx decode 150 scripts/profile_decode.py --ncu
    cat "$R/ncu-decode-loads.txt" | head -80
    timeout 240 python scripts/decode_tile_sweep.py --out "$R" 2>&1 | tee "$R/decode_tile_sweep.txt" | grep -E "TB/s|rror" ;;
  D)  # round C: the excess is ours alone and per instruction: 24 L2 sectors per 512-byte cp.async where cuDNN's (the
      # same instruction) has the ideal 16, with 4-8 excess shared-store wavefronts: the padded rows split a warp's
      # copy. K/V ring rows now unpadded with XOR-swizzled chunks (whole 128-byte lines per copy, conflict-free
      # ldmatrix). The decode suite, the profile (kernel times; Nsight Compute's sectors), the sweep, bench_decode
    run_tests decode 150 -n 4 tests/gpu/test_decode_gpu.py
    for s in "8 32768" "1 131072"; do set -- $s
      timeout 60 python scripts/profile_decode.py --B $1 --L $2 2>&1 | grep -v arn | tee -a "$R/profile_decode.txt"; done
    ncu_nvtx decode 150 scripts/profile_decode.py --ncu
    awk '/^== /{k++} k==1 && /LDGSTS/ && $(NF-12) > 10000' "$R/ncu-decode-loads.txt" | head -8
    timeout 200 python scripts/decode_tile_sweep.py --out "$R" 2>&1 | tee "$R/decode_tile_sweep.txt" | grep -E "TB/s|rror"
    timeout 200 python benchmarks/bench_decode.py --out "$R" 2>&1 | grep -E "^\||rror" ;;
  E)  # round D: 4.19 / 4.21 / 3.81 TB/s, the kernel level with cuDNN's (240.6 / 240.9 us at B=8, ideal L2 sectors).
      # The combine: one round trip for up to 64 splits (8 warps, 8 splits each in flight); the split count by the
      # critical path (waves x tiles per split + a CTA's fixed cost: 33 at B=1, 32 before). The decode suite, kernel
      # times, 33 against 32 splits at B=1, bench_decode; the FP8 suite and bench_fp8 (descales stacked in one kernel)
    run_tests decode 150 -n 4 tests/gpu/test_decode_gpu.py
    for s in "8 32768" "1 131072"; do set -- $s
      timeout 60 python scripts/profile_decode.py --B $1 --L $2 2>&1 | grep -v arn | tee -a "$R/profile_decode.txt"; done
    timeout 100 python scripts/decode_tile_sweep.py --configs 0 2>&1 | tee "$R/decode_tile_sweep.txt" | grep -E "B=1 |rror"
    timeout 200 python benchmarks/bench_decode.py --out "$R" 2>&1 | grep -E "^\||rror"
    run_tests fp8 120 tests/gpu/test_fp8_gpu.py
    timeout 150 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    pack_results ;;
  F)  # the final tree's decode in issue 12's greedy loop: the suite (tokens against SDPA, graph replays against eager
      # steps) and llama_decode.py's tokens/s
    run_tests llama 60 -s tests/gpu/test_llama_decode_gpu.py
    timeout 100 python benchmarks/llama_decode.py --out "$R" 2>&1 | tail -n 12
    pack_results ;;
esac
