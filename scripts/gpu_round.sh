#!/usr/bin/env bash
# One device round on the H200: environment facts, parallel kernel builds + GPU tests, benchmark.
# Usage (on the device, from the repo root): scripts/gpu_round.sh [tests|tests1|tests2|api|bench|issue15|first-call|sweep|specialize|sanitize|profile|probe|tiles|all]...
# Logs and results go to $OUT (the device tool brings that folder back) or, when $OUT is unset, to
# benchmarks/results/<UTC date>-<device, e.g. h200>-<git short commit>/ (see benchmarks/results/README.md).
# A README.md stub there records the command line, commit, date and steps.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export ATTNGEN_CACHE_DIR="${ATTNGEN_CACHE_DIR:-/tmp/attngen-cache}"
export ATTNGEN_TEST_BUILD_JOBS="${ATTNGEN_TEST_BUILD_JOBS:-12}"
# one kernel cache for every pytest run of the round and each of its workers (tests/conftest.py): a signature is built once
export ATTNGEN_TEST_SHARED_CACHE="${ATTNGEN_TEST_SHARED_CACHE:-/tmp/attngen-test-cache}"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# device short name: "NVIDIA H200" -> h200, "NVIDIA A100-SXM4-80GB" -> a100, "NVIDIA GeForce RTX 4090" -> 4090
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
  | sed -E 's/NVIDIA|GeForce|RTX|Tesla//g' | awk '{print $1}' | cut -d- -f1 | tr -cd 'A-Za-z0-9' | tr 'A-Z' 'a-z')
RES="${OUT:-benchmarks/results/$(date -u +%Y-%m-%d)-${gpu:-unknown}-$commit}"
mkdir -p "$RES"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(all)
dirty=""; [ "$commit" != unknown ] && [ -n "$(git status --porcelain -- attngen benchmarks scripts tests ':!benchmarks/results' 2>/dev/null)" ] \
  && dirty=" (working tree has uncommitted changes under attngen/ benchmarks/ scripts/ tests/)"
cat > "$RES/README.md" <<EOF
# Device round $(date -u +%Y-%m-%d), ${gpu:-unknown}, commit $commit

- command: \`$0 $*\`${TILE_SWEEPS:+, TILE_SWEEPS=\"$TILE_SWEEPS\"}${PROFILE_VARIANTS:+, PROFILE_VARIANTS=\"$PROFILE_VARIANTS\"}
- commit: $commit$dirty
- date: $(date -u +%Y-%m-%dT%H:%M:%SZ) (UTC, start)
- steps: ${steps[*]}
- files: device.txt, gpu_clocks.csv and the logs / forward-*.md|json of the steps above (see scripts/gpu_round.sh)
EOF
{
  date -u +"date %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cudnn', torch.backends.cudnn.version())"
  nvcc --version | tail -1
} > "$RES/device.txt" 2>&1
cat "$RES/device.txt"
# SM clock, power, temperature and throttle reasons every half second, for the whole round
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 500 > "$RES/gpu_clocks.csv" 2>&1 &
smi_pid=$!
trap 'kill $smi_pid 2>/dev/null' EXIT
rc=0
for step in "${steps[@]}"; do
  case "$step" in
    tests1|tests2)
      # the suite in two device calls (cold, the whole of it takes longer than one): tests1 = the API, training,
      # integration and small files; tests2 = the kernel suites, the mask zoo, decode, FP8 and the API suite on sm80
      if [ "$step" = tests1 ]; then
        files="tests/gpu/test_autograd_gpu.py tests/gpu/test_gpu_api.py tests/gpu/test_integrations_gpu.py
               tests/gpu/test_bwd_gpu.py tests/gpu/test_codegen_gpu.py tests/gpu/test_mod_checks_gpu.py
               tests/gpu/test_negative_index.py tests/gpu/test_reference_cuda.py tests/gpu/test_params_gpu.py
               tests/gpu/test_captured_grads_gpu.py tests/gpu/test_deterministic_gpu.py"
      else
        files="tests/gpu/test_kernel_gpu.py tests/gpu/test_kernel_sm90.py tests/gpu/test_mask_zoo_gpu.py
               tests/gpu/test_decode_gpu.py tests/gpu/test_llama_decode_gpu.py tests/gpu/test_varlen_gpu.py
               tests/gpu/test_fp8_gpu.py tests/gpu/test_relative_gpu.py"
      fi
      # -v names each test as it starts, so a call cut short by TESTS_TIMEOUT still says where it was
      ATTNGEN_TEST_FAILURES="$RES/gpu_test_failures_$step.txt" timeout "${TESTS_TIMEOUT:-900}" \
        python -m pytest -v -m gpu -p no:cacheprovider --durations=15 $files 2>&1 | tee "$RES/gpu_tests_$step.log" | tail -n 20
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      if [ "$step" = tests2 ]; then
        ATTNGEN_TEST_BACKEND=sm80 timeout "${TESTS_TIMEOUT:-900}" python -m pytest -q -m gpu -p no:cacheprovider \
          tests/gpu/test_gpu_api.py 2>&1 | tee "$RES/gpu_tests_sm80.log" | tail -n 5
        [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      fi ;;
    tests|all)
      t0=$(date +%s)
      # GPU_TEST_FILES narrows the run (the whole suite cold takes longer than one device call: split it);
      # failures are written to gpu_test_failures.txt as they happen (tests/conftest.py)
      ATTNGEN_TEST_FAILURES="$RES/gpu_test_failures.txt" python -m pytest -q -m gpu -p no:cacheprovider \
        ${GPU_TEST_FILES:-tests/} 2>&1 | tee "$RES/gpu_tests.log" | tail -n 40
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      # the public-API suite again on the portable kernel ('auto' picks sm90 on Hopper)
      ATTNGEN_TEST_BACKEND=sm80 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_api.py 2>&1 \
        | tee "$RES/gpu_tests_sm80.log" | tail -n 5
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      echo "gpu tests: $(( $(date +%s) - t0 )) s" ;;&
    api)
      # the public-API GPU suite alone (sm90 picked on Hopper), optionally narrowed: API_K="alibi or rel_div"
      python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_gpu_api.py ${API_K:+-k "$API_K"} 2>&1 \
        | tee "$RES/gpu_tests_api.log" | tail -n 15
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    bench|all)
      python benchmarks/bench_forward.py --out "$RES" 2>&1 | tee "$RES/bench.log" | tail -n 40 ;;&
    issue15)
      # issue 15 point 4's partial-tile variants beside flex (and SDPA where it applies), one process
      python benchmarks/bench_forward.py --set issue15 --no-compile-figures --out "$RES" 2>&1 | tee "$RES/bench-issue15.log" | tail -n 20 ;;
    first-call)
      # issue 15 point 3: a new process's first call of a cached variant, seconds beyond `import torch`
      python scripts/first_call.py --cache-dir "$ATTNGEN_CACHE_DIR" --runs 3 2>&1 | tee "$RES/first_call.log" | tail -n 12 ;;
    sweep)
      python benchmarks/bench_forward.py --no-anchors --no-compile-figures --sweep --out "$RES" 2>&1 | tee "$RES/sweep.log" | tail -n 40
      if python -c "import matplotlib" 2>/dev/null; then
        python benchmarks/plot_sweep.py "$(ls -t "$RES"/forward-*.json | head -1)" --out "$RES"
      else
        echo "no matplotlib here: plot with benchmarks/plot_sweep.py on another machine"
      fi ;;
    sanitize)
      # forward, backward and decode kernels: memcheck and racecheck on a small case per head dim
      python scripts/sanitize_case.py --build --backward
      python scripts/sanitize_case.py --build --decode
      for tool in memcheck racecheck; do
        timeout 150 compute-sanitizer --tool $tool python scripts/sanitize_case.py --backward 2>&1 | tee "$RES/$tool.log" | tail -n 6
        timeout 100 compute-sanitizer --tool $tool python scripts/sanitize_case.py --decode 2>&1 | tee "$RES/$tool-decode.log" | tail -n 6
      done ;;
    profile)
      # Nsight Compute on one warm launch per variant: stall reasons, pipe utilisation, hot SASS lines
      # (PROFILE_ARGS, e.g. "--S 4096", go to scripts/profile_case.py).
      for var in ${PROFILE_VARIANTS:-full causal softcap}; do
        python scripts/profile_case.py "$var" --build ${PROFILE_ARGS:-}
        timeout 150 ncu --clock-control none -k regex:attngen_fwd --launch-skip 1 --launch-count 1 \
          --set full --import-source no -f -o "$RES/ncu-$var" python scripts/profile_case.py "$var" ${PROFILE_ARGS:-} \
          > "$RES/ncu-$var.log" 2>&1
        ncu --import "$RES/ncu-$var.ncu-rep" --page details > "$RES/ncu-$var-details.txt" 2>&1
        ncu --import "$RES/ncu-$var.ncu-rep" --page source --csv --print-source sass \
          > "$RES/ncu-$var-sass.csv" 2>&1
        grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per" "$RES/ncu-$var-details.txt" | head -8
        rm -f "$RES/ncu-$var.ncu-rep"
      done
      # the device tool returns at most 8 files: one archive for all the reports
      tar czf "$RES/ncu.tgz" -C "$RES" $(cd "$RES" && ls ncu-*) && rm -f "$RES"/ncu-* ;;
    probe)
      # warm load and host time per call, split by layer: one run fills the cache, two are reported
      probe_cache=/tmp/attngen-probe-cache  # its own cache, for this step only
      ATTNGEN_CACHE_DIR=$probe_cache python scripts/load_probe.py > /dev/null 2>&1
      for i in 1 2; do ATTNGEN_CACHE_DIR=$probe_cache python scripts/load_probe.py; done 2>&1 \
        | tee "$RES/load_probe.txt" ;;
    specialize)
      # issue 14: runtime parameters against values baked in, each library anchor built both ways, interleaved
      python scripts/specialize_ab.py --out "$RES" 2>&1 | tee "$RES/specialize_ab.log" | tail -n 14 ;;
    tiles)
      # A/B of tile settings, interleaved rounds, "variants:tiles[:D[:S[:B[:H]]]]" separated by ';', e.g.
      # TILE_SWEEPS="full,causal:128x2,176x2;softcap:128x2,128x2-pe3-fl;full:128x3,128x3-rt8:64"
      IFS=';' read -ra sweeps <<< "${TILE_SWEEPS:-full,causal,softcap:128x2,176x2}"
      for sw in "${sweeps[@]}"; do
        IFS=':' read -r sw_vars sw_tiles sw_d sw_s sw_b sw_h <<< "$sw"
        python scripts/tile_sweep.py --variants "$sw_vars" --tiles "$sw_tiles" --D "${sw_d:-128}" \
          --S "${sw_s:-8192}" --B "${sw_b:-2}" --H "${sw_h:-16}" 2>&1
      done | tee "$RES/tiles.log" | grep -E "^\||Error|error" ;;
    tests|bench|all|api) ;;
    *) echo "unknown step $step"; rc=2 ;;
  esac
done
exit $rc
