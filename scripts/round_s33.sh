#!/usr/bin/env bash
# Session 33's device calls, as they ran (scripts/round_s33.sh X on the H200; results in
# benchmarks/results/2026-12-04-h200-session33/round-X/):
# A: 80 q rows per step (Sm90BwdTiles.block_q = 80: dQ^T = K^T dS^T, dS^T in 32-byte swizzle rows) against float64
#    (test_block_q_80_matches_float64), then full and causal on the split rung at 64 and 80 rows (and 80 with dK
#    last), A B C A' (A' the same build as A under another name), bwd_tiles_ab.py.
# B: session 32's ladder under the API and mask-zoo GPU suites (the window, document and union backward cases take its
#    split + staged rung), then Nsight Compute's full set on full attention's backward (warm, S 8192), the shipped
#    split rung at 64 q rows and the same at 80.
# C: where full attention's step goes (step_kernel_times.py: each kernel's time in the step and the GPU's span, full and
#    causal), the SM clock and power sampled meanwhile (nvidia-smi, every 250 ms) and during bwd_tiles_ab.py's full
#    at 64 and 80 q rows.
# D: on the landed tree (the 64-row kernel's templates changed with the 80-row one: the staged dQ's size and offsets,
#    dS^T's store, the dQ product's steps): the backward, deterministic, autograd and captured-gradient suites, then
#    the backward's small cases under compute-sanitizer memcheck and racecheck.
# E: dQ split between the consumers by kv rows at head dim 128 (an experimental Sm90BwdTiles.dq_kv_split, not landed:
#    DQ_SPLIT_D forced off, the head dim 64 path, each consumer's dQ over its own 64 kv rows and all 128 columns, both
#    added into one dQ_acc tile) against the column split (a GPU test, not landed), then A B A' B' on the rungs the
#    ladders take: full and causal on the split rung, the window and the document on split + staged.
# F: test_bwd_gpu.py after its review (one float64 judge and one variant factory shared by its tests).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests, smoke_backward, sanitize_backward, pack_results
case "$1" in
  A)
    run_tests bq80 240 -n 8 tests/gpu/test_bwd_gpu.py -k block_q_80
    timeout 300 python scripts/bwd_tiles_ab.py --variants full causal --set split_probs=1 \
      block_q=80,split_probs=1 block_q=80,split_probs=1,dk_last=1 split_probs=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_block_q_80.log" | grep -E "TFLOP|grad at|rror"
    pack_results ;;
  B)
    run_tests api_zoo 260 -n 8 tests/gpu/test_gpu_api.py tests/gpu/test_mask_zoo_gpu.py
    ncu_profile bwd-full-bq64 "attngen_bwd_kernel" 150 full --backward
    ncu_profile bwd-full-bq80 "attngen_bwd_kernel" 150 full --backward --bwd-set block_q=80,split_probs=1
    pack_results ;;
  C)
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 250 > "$R/smi.csv" &
    smi=$!
    timeout 200 python scripts/step_kernel_times.py --variants full causal --windows --no-flex > "$R/step_kernel_times.md" 2>&1
    grep -E "^\||rror" "$R/step_kernel_times.md"
    echo "--- bwd_tiles_ab" >> "$R/smi.csv"
    timeout 150 python scripts/bwd_tiles_ab.py --variants full --set split_probs=1 block_q=80,split_probs=1 2>&1 \
      | tee "$R/bwd_block_q_80_full.log" | grep -E "TFLOP|rror"
    kill $smi
    python - "$R/smi.csv" <<'PY'
import sys
rows = [l.split(", ") for l in open(sys.argv[1]) if l[:1].isdigit() or l.startswith("20")]
mhz = sorted(int(r[1].split()[0]) for r in rows if len(r) > 2 and r[1].split()[0].isdigit())
watts = sorted(float(r[2].split()[0]) for r in rows if len(r) > 2 and r[2].split()[0].replace(".", "").isdigit())
if mhz:
    print(f"SM clock MHz: {len(mhz)} samples, min {mhz[0]}, median {mhz[len(mhz) // 2]}, max {mhz[-1]}; "
          f"power W median {watts[len(watts) // 2]:.0f}, max {watts[-1]:.0f}")
PY
    pack_results ;;
  D)
    run_tests bwd 300 -n 8 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py \
      tests/gpu/test_captured_grads_gpu.py
    smoke_backward 120 && { sanitize_backward memcheck 100; sanitize_backward racecheck 120; }
    pack_results ;;
  E)
    run_tests kvsplit 200 -n 4 tests/gpu/test_bwd_gpu.py -k dq_split_by_kv_rows
    timeout 200 python scripts/bwd_tiles_ab.py --variants full causal --set split_probs=1 split_probs=1,dq_kv_split=1 \
      split_probs=1,walk_shift=0 split_probs=1,dq_kv_split=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_dq_kv_split_full_causal.log" | grep -E "TFLOP|grad at|rror"
    S="split_probs=1,dkv_staged=1"
    timeout 150 python scripts/bwd_tiles_ab.py --variants sliding_window document --set $S $S,dq_kv_split=1 \
      $S,walk_shift=0 $S,dq_kv_split=1,walk_shift=0 2>&1 \
      | tee "$R/bwd_dq_kv_split_window_document.log" | grep -E "TFLOP|grad at|rror"
    pack_results ;;
  F)
    run_tests bwd_review 300 -n 8 tests/gpu/test_bwd_gpu.py
    pack_results ;;
esac
