# scripts/device_step.sh: sourced (from the repo root) by a session's device-call scripts (scripts/round_s*.sh):
# the environment of one call, the device line in $OUT/device.txt, and run_tests: one pytest run of GPU tests under
# a time limit, its log and failures under $OUT, its counts, failed tests and last lines printed; smoke_backward
# and sanitize_backward: the backward's small cases (scripts/sanitize_case.py) run plainly or under a sanitizer;
# ncu_profile: Nsight Compute's full set on one warm launch of scripts/profile_case.py, its details and hot SASS lines.
# ncu_nvtx: the same for every kernel a script launches inside an NVTX range named "profiled".
# ncu_tail: the SMs' active cycles of the forward's and backward's main kernels against the elapsed (the grid's tail).
# backward_suites: the backward's GPU suites and sanitizer cases; training_table: bench_training.py's table; keep: the
# small cases' logs of one setting into a folder of their own.
# pack_results: everything under $OUT in one archive (a call brings back a handful of files).
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache ATTNGEN_TEST_BUILD_JOBS=14
# pytest -n: one kernel cache for every worker (tests/conftest.py), so a signature is built once per call
export ATTNGEN_TEST_SHARED_CACHE=/tmp/attngen-test-cache
R="$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$R/device.txt"
run_tests() {  # name timeout files...
  local name=$1 t=$2; shift 2
  ATTNGEN_TEST_FAILURES="$R/failures_$name.txt" timeout "$t" python -m pytest -v -m gpu -p no:cacheprovider \
    --durations=15 "$@" > "$R/tests_$name.log" 2>&1
  echo "tests $name rc=$? $(grep -cE ' PASSED' "$R/tests_$name.log") passed, $(grep -cE ' FAILED' "$R/tests_$name.log") failed"
  grep -E ' FAILED' "$R/tests_$name.log" | head -n 20
  tail -n 3 "$R/tests_$name.log"
}
smoke_backward() {  # [timeout [sanitize_case.py args...]]: the backward's small sanitizer cases built, then run once;
  # false when one fails
  local t=${1:-60}; shift || true
  python scripts/sanitize_case.py --build --backward "$@" > "$R/build.log" 2>&1
  timeout "$t" python scripts/sanitize_case.py --backward "$@" > "$R/smoke.log" 2>&1
  tail -n 2 "$R/smoke.log"
  grep -q "SANITIZE CASES DONE ok" "$R/smoke.log"
}
sanitize_backward() {  # tool timeout [sanitize_case.py args...]: compute-sanitizer on the backward's small cases (built),
  # its summary lines
  local tool=$1 t=$2; shift 2
  timeout "$t" compute-sanitizer --tool "$tool" --print-limit 20 python scripts/sanitize_case.py --backward "$@" \
    > "$R/$tool.log" 2>&1
  echo "$tool rc=$?"; grep -E "^========= (Error|RACECHECK|ERROR SUMMARY)|SANITIZE" "$R/$tool.log" | head -n 8
}
ncu_profile() {  # name kernel-regex timeout profile_case.py-args...: $R/ncu-<name>-details.txt, -sass.csv.gz, -hot.txt
  local name=$1 kernel=$2 t=$3; shift 3
  python scripts/profile_case.py "$@" --build
  timeout "$t" ncu --clock-control none -k "regex:$kernel" --launch-skip 1 --launch-count 1 --set full \
    --import-source no -f -o "$R/ncu-$name" python scripts/profile_case.py "$@" > "$R/ncu-$name.log" 2>&1
  ncu --import "$R/ncu-$name.ncu-rep" --page details > "$R/ncu-$name-details.txt" 2>&1
  ncu --import "$R/ncu-$name.ncu-rep" --page source --csv --print-source sass | gzip > "$R/ncu-$name-sass.csv.gz"
  rm -f "$R/ncu-$name.ncu-rep"
  grep -E "Duration|Throughput|Issue Slots Busy|No Eligible|Registers Per|Pipe|Achieved Occ" "$R/ncu-$name-details.txt" \
    | head -24
  python scripts/ncu_hot_lines.py "$R/ncu-$name-sass.csv.gz" --top 30 | tee "$R/ncu-$name-hot.txt"
}
ncu_nvtx() {  # name timeout script args...: Nsight Compute's full set on every kernel inside an NVTX push/pop range "profiled"
  local name=$1 t=$2; shift 2
  timeout "$t" ncu --clock-control none --nvtx --nvtx-include "profiled/" --set full --import-source no \
    -f -o "$R/ncu-$name" python "$@" > "$R/ncu-$name.log" 2>&1
  ncu --import "$R/ncu-$name.ncu-rep" --page details > "$R/ncu-$name-details.txt" 2>&1
  ncu --import "$R/ncu-$name.ncu-rep" --page source --csv --print-source sass | gzip > "$R/ncu-$name-sass.csv.gz"
  rm -f "$R/ncu-$name.ncu-rep"
  python scripts/ncu_loads.py "$R/ncu-$name-sass.csv.gz" > "$R/ncu-$name-loads.txt" 2>&1
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Registers Per|Achieved Occ|No Eligible|Issue Slots Busy" \
    "$R/ncu-$name-details.txt" | head -40
}
ncu_tail() {  # name timeout profile_case.py-args...: the forward's and the backward's main kernel (the second call of
  # each), their SMs' active cycles (avg, min, max) against the elapsed cycles: how much of the grid idles at its end
  local name=$1 t=$2; shift 2
  python scripts/profile_case.py "$@" --build
  timeout "$t" ncu --clock-control none -k "regex:attngen_(fwd|bwd)_kernel" --launch-skip 2 --launch-count 2 \
    --metrics sm__cycles_active.avg,sm__cycles_active.min,sm__cycles_active.max,sm__cycles_elapsed.max,gpu__time_duration.sum \
    --csv --page raw python scripts/profile_case.py "$@" > "$R/tail-$name.csv" 2> "$R/tail-$name.log"
  python scripts/ncu_tail.py "$R/tail-$name.csv" "$name" | tee -a "$R/tail.md"
}
backward_suites() {  # the backward, deterministic and autograd suites, then the backward's small cases, sanitized
  run_tests bwd 330 -n 8 tests/gpu/test_bwd_gpu.py tests/gpu/test_deterministic_gpu.py tests/gpu/test_autograd_gpu.py
  smoke_backward 100 && { sanitize_backward memcheck 90; sanitize_backward racecheck 200; }
}
training_table() {  # [timeout]: bench_training.py's anchors against flex and cuDNN, its table printed
  timeout "${1:-330}" python benchmarks/bench_training.py --out "$R" > "$R/training.log" 2>&1
  grep -E "^\||rror" "$R/training.log"
}
keep() {  # name: the small cases' logs of one setting moved under $R/<name>/ (the next setting's would overwrite them)
  mkdir -p "$R/$1" && mv "$R"/{build,smoke,memcheck,racecheck}.log "$R/$1/" 2>/dev/null; true
}
pack_results() {  # every file under $R into $R/results.tgz (a call brings back only a few files)
  (cd "$R" && tar czf /tmp/results.tgz --exclude=results.tgz . && find . -type f -delete && mv /tmp/results.tgz .)
}
