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
# (A ran: the tiled postprocess took 117.5-121.9 µs against 70.3-72.6: reverted in 6b40be3. F ran: FP8 21 / 21,
# forward 161 / 161; FP8 ÷ bf16 1.160x full, 1.018x causal with 0.208 ms of the call in the torch V^T copy.)
# G = the FP8 forward with V^T made by the library's own kernel: its GPU suite, fp8_tile_sweep.py (stages, overlap,
# pingpong, persistent grid; the attention kernel alone beside the bf16 call), bench_fp8.py, and Nsight Compute's
# pipe utilisation and warp states of the FP8 and bf16 full forward.
# (G ran: the library's V^T 0.032 ms; FP8 ÷ bf16 1.293x full, 1.248x causal; the FP8 kernel with 46% tensor-pipe
# cycles, 48% of the SFU (XU) and 58% of scheduler cycles with no eligible warp: its softmax's latency sets the pace.)
# H = the FP8 ladder's new first rung (2 stages, every 4th exponential on the FMA pipe, the persistent grid at every
# length for masked variants): its GPU suite, fp8_tile_sweep.py around it (emulation share, pingpong, stages),
# bench_fp8.py.
# (H ran, on 50060d8, whose sweep script had the -eN flag: FP8 25 / 25; the emulation moved nothing beyond noise
# (kernel alone, full: every 4th 1.3502 ms, none 1.3317, every 8th 1.3463; causal 0.7375 / 0.7417 / 0.7172; every
# 3rd or 2nd 4-8% slower): taken out again; FP8 ÷ bf16 1.277x full, 1.287x causal with the library's V^T.)
# I = the final tree (ABI 4 under every forward library; the session's last 300 s of device time): the FP8 suite
# after the review's mends, and the API suite (its 16-bit libraries now speak ABI 4).
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
  G)
    run_tests fp8 120 tests/gpu/test_fp8_gpu.py
    timeout 150 python scripts/fp8_tile_sweep.py --variants full,causal --tiles 3,2,4,3-noov,3-nopp,3-pers \
      2>&1 | tee "$R/fp8_tile_sweep.md" | grep -E "^\||V transpose|rror"
    timeout 150 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!"
    printf '%s\n' 'import sys, torch, attngen' 'from bench_fp8 import quantise' \
      'x = [torch.randn(2, 16, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3)]' \
      'attn = attngen.compile()' 'attn(*x)' 'q = [quantise(t, 16) for t in x]' \
      'attn(q[0][0], q[1][0], q[2][0], q_descale=q[0][1], k_descale=q[1][1], v_descale=q[2][1])' \
      'torch.cuda.synchronize()' > /tmp/fp8_one.py
    PYTHONPATH="$PWD:$PWD/benchmarks" timeout 90 ncu --clock-control none -k regex:attngen_fwd_kernel -c 2 \
      --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
      python /tmp/fp8_one.py > "$R/ncu_fp8_fwd.txt" 2>&1
    grep -E "attngen_fwd_kernel|Stall|Warp Cycles|Issued|Eligible|Duration|Busy|Ipc" "$R/ncu_fp8_fwd.txt" | head -n 50
    # pipe utilisation (metric names may differ by ncu version: a failure here costs only this step)
    PYTHONPATH="$PWD:$PWD/benchmarks" timeout 60 ncu --clock-control none -k regex:attngen_fwd_kernel -c 2 --metrics \
      sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active \
      python /tmp/fp8_one.py > "$R/ncu_fp8_pipes.txt" 2>&1
    grep -E "attngen_fwd_kernel|pipe|ERROR" "$R/ncu_fp8_pipes.txt" | head -n 20 ;;
  H)
    run_tests fp8 120 tests/gpu/test_fp8_gpu.py
    timeout 200 python scripts/fp8_tile_sweep.py --variants full,causal \
      --tiles 2,2-e0,2-e8,2-e3,2-e2,2-nopp,2-nopp-e3,3 2>&1 | tee "$R/fp8_tile_sweep.md" | grep -E "^\||V transpose|rror"
    timeout 150 python benchmarks/bench_fp8.py --out "$R" 2>&1 | grep -E "^\||rror|!!" ;;
  I)
    run_tests fp8 70 tests/gpu/test_fp8_gpu.py
    run_tests api 120 tests/gpu/test_gpu_api.py ;;
esac
