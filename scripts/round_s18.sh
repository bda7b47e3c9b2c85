#!/usr/bin/env bash
# Session 18's device calls. A: the division score mod after the codegen change (ag_fdiv as rcp.approx.ftz times the
# numerator, no per-call denormal rescale; score_rel's a(d) s without the scale when b(d) = 0, the softmax factor
# carrying it): the API and codegen GPU suites (rel_div in a window, its LSE), the tile sweep of div_score with and
# without the persistent grid, the masked anchors on the persistent grid at S = 8192 against the default (one CTA per
# tile beyond 4096 kv rows), then bench_forward (attngen, flex, cuDNN in one process) on the affected variants.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_step.sh  # environment, $R, run_tests
case "$1" in
  A)
    run_tests api 200 -n 4 tests/gpu/test_gpu_api.py tests/gpu/test_codegen_gpu.py
    timeout 150 python scripts/tile_sweep.py --variants div_score --tiles 176x2-rt8,176x2-rt8-pers,128x2-rt8,128x2-rt8-pers \
      2>&1 | tee "$R/tile_sweep_div.md" | grep -E "^\||rror"
    timeout 150 python scripts/tile_sweep.py --variants sliding_window,alibi_causal,causal \
      --tiles 128x2-rt8-pers4096,128x2-rt8-pers 2>&1 | tee "$R/tile_sweep_masked.md" | grep -E "^\||rror"
    timeout 240 python benchmarks/bench_forward.py --variants div_score head_scale alibi_causal sliding_window \
      --no-compile-figures --out "$R" 2>&1 | tee "$R/bench.log" | grep -E "^\||rror" | tail -n 14
    pack_results ;;
  B)  # round A: div_score 1.42x flex (562.1 vs 394.5 TFLOP/s); test_explicit_scale[rel_div] failed at scale <= 0 (the
      # row max over a(d) q.k needs scale > 0: the call is now rewritten as for variants without score_mod); the masked
      # sweep had run without the runtime parameters (tile_sweep.py now passes them). Now also: alibi's b(d) stepped with
      # one FFMA per d (SCORE_REL_LINEAR), and s * a[h] left raw where scale a[h] > 0. The API suite (new head_factor
      # variants: factors of both signs and zero), the masked anchors on the persistent grid at S = 8192, bench_forward
      # on the two changed variants
    run_tests api 300 -n 4 tests/gpu/test_gpu_api.py
    timeout 150 python scripts/tile_sweep.py --variants sliding_window,alibi_causal,causal \
      --tiles 128x2-rt8-pers4096,128x2-rt8-pers 2>&1 | tee "$R/tile_sweep_masked.md" | grep -E "^\||rror"
    timeout 140 python benchmarks/bench_forward.py --variants head_scale alibi_causal \
      --no-compile-figures --out "$R" 2>&1 | tee "$R/bench.log" | grep -E "^\||rror" | tail -n 6
    pack_results ;;
  C)  # round B: API suite 138 passed; head_scale 1.40x flex (was 1.31x), alibi + causal 1.49x (1.44x); at S = 8192 the
      # persistent grid beat one CTA per tile on the three masked anchors swept (window +5.2%, alibi + causal +2.0%,
      # causal +1.3%), so masked variants now take it at every kv length. The other masked anchors and issue 15's
      # masked variants swept both ways (pers4096: the old default), then bench_forward on every anchor and issue 15 variant
    timeout 200 python scripts/tile_sweep.py \
      --variants prefix_lm,document,document_cuts,softcap_causal,local_global,dilated_window,document_unsorted \
      --tiles 128x2-rt8-pers4096,128x2-rt8-pers 2>&1 | tee "$R/tile_sweep_masked.md" | grep -E "^\||rror"
    timeout 340 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants full causal sliding_window \
      softcap softcap_causal alibi_causal document document_cuts prefix_lm dilated_window div_score head_scale \
      document_unsorted local_global 2>&1 | tee "$R/bench.log" | grep -E "^\||rror" | tail -n 18
    pack_results ;;
  D)  # round C: the persistent grid matched or beat one CTA per tile on every masked variant swept; every anchor and
      # issue 15 variant 1.33-2.44x flex. The final tree: the API and sm90 kernel suites (masked variants past 4096 kv
      # rows now persistent), then issue 15's short-sequence and D = 64 causal points beside cuDNN
    run_tests fwd 330 -n 4 tests/gpu/test_gpu_api.py tests/gpu/test_kernel_sm90.py
    timeout 60 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal --seq 1024 \
      --batch 16 2>&1 | tee "$R/bench-s1024.log" | grep -E "^\||rror" | tail -n 3
    timeout 80 python benchmarks/bench_forward.py --no-compile-figures --out "$R" --variants causal full --head-dim 64 \
      2>&1 | tee "$R/bench-d64.log" | grep -E "^\||rror" | tail -n 4
    pack_results ;;
esac
