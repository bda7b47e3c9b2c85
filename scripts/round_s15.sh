#!/usr/bin/env bash
# Session 15's device calls (prepared in session 14 on branch next/post-tiled, not yet run):
# (A: about 520 s on a fresh machine; B, the ncu report, in a call of its own)
# A = the sm90 backward's own postprocess, reading the tiled dQ_acc in its staging order (a warp reads 512
# contiguous bytes; session 13's read 8-byte pieces 16 bytes apart, 72 µs a step for 201 MB): the backward's smoke
# cases, the backward / deterministic / captured-gradient suites (dq poisoned: a missed element fails), the step
# kernel by kernel (bwd_post against session 13's 70.3-72.6 µs), the anchors' training steps beside flex and cuDNN.
# F = the FP8 (e4m3) forward: its GPU suite (tests/gpu/test_fp8_gpu.py), the sm90 forward suite (the ABI and TMA
# encoding it shares changed), the backward's smoke cases (its TMA encoding call changed), and benchmarks/bench_fp8.py
# (FP8 beside bf16, flex and cuDNN at B2 H16 S8192 D128, full and causal, with the errors against float64).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    python scripts/sanitize_case.py --build --backward > "$R/build.log" 2>&1
    timeout 50 python scripts/sanitize_case.py --backward > "$R/smoke.log" 2>&1
    tail -n 2 "$R/smoke.log"
    grep -q "SANITIZE CASES DONE ok" "$R/smoke.log" || exit 1
    run_tests bwd 100 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py \
      tests/gpu/test_captured_grads_gpu.py
    timeout 60 python scripts/step_kernel_times.py --variants causal full --windows 1024 --no-flex 2>&1 \
      | tee "$R/step_kernel_times.md" | grep -vE "^\| .* \| triton_"
    timeout 210 python benchmarks/bench_training.py --out "$R" 2>&1 | grep -E "^\||rror" ;;
  B)
    # the causal backward's warp states and scheduler under ncu (one kernel, clocks left alone)
    printf '%s\n' 'import torch, attngen' 'attn = attngen.compile(causal=True)' \
      'x = [torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(4)]' \
      'attn(x[0], x[1], x[2]).backward(x[3].detach())' 'torch.cuda.synchronize()' > /tmp/one_step.py
    timeout 150 ncu --clock-control none -k regex:attngen_bwd_kernel -c 1 --section WarpStateStats \
      --section SchedulerStats python /tmp/one_step.py > "$R/ncu_bwd.txt" 2>&1
    grep -E "Stall|Warp Cycles|Issued|Eligible|Duration" "$R/ncu_bwd.txt" | head -n 30 ;;
  F)
    run_tests fp8 150 tests/gpu/test_fp8_gpu.py
    smoke_backward 60 || echo "backward smoke FAILED"
    timeout 200 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    run_tests fwd 170 tests/gpu/test_kernel_sm90.py ;;
esac
