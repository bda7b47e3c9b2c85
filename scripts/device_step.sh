# scripts/device_step.sh: sourced (from the repo root) by a session's device-call scripts (scripts/round_s*.sh):
# the environment of one call, the device line in $OUT/device.txt, and run_tests: one pytest run of GPU tests under
# a time limit, its log and failures under $OUT, its counts, failed tests and last lines printed.
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 ATTNGEN_CACHE_DIR=/tmp/attngen-cache ATTNGEN_TEST_BUILD_JOBS=14
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
