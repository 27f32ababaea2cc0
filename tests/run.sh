#!/usr/bin/env bash
# Runs every test of deltaserve and ends with the line "N passed, N failed".
#   - C test binaries build/tests/test_* (each prints PASS/FAIL lines)
#   - shell tests tests/*_test.sh and node tests tests/*.test.mjs (same PASS/FAIL protocol)
# A binary that crashes or exits non-zero without a FAIL line counts as one failure.
# Arguments: the build folders whose suites to run (default: build). A folder named *asan* runs
# the same tests in the ASan + UBSan build (fuzzers, already sanitized, and the CUDA compile
# check run only once, in the first suite).
set -u
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- build
pass=0; fail=0
log=$(mktemp)
run_one() { # name, command...
  local name=$1; shift
  "$@" >"$log" 2>&1
  local rc=$?
  local p f
  p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL $name: exited with status $rc"; fi
  grep -E '^(PASS|FAIL) ' "$log"
  if [ "$f" -gt 0 ] || [ "$rc" -ne 0 ]; then echo "--- output of $name (last 30 lines) ---"; grep -vE '^PASS ' "$log" | tail -30; fi
  pass=$((pass + p)); fail=$((fail + f))
}
run_suite() {
BUILD=$1
export DS_BUILD=$BUILD
echo "=== suite $BUILD"
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  case "$t" in *.d|*.o) continue;; esac
  run_one "$(basename "$t")" "$t"
done
for t in tests/*_test.sh; do
  [ -f "$t" ] || continue
  run_one "$(basename "$t")" bash "$t"
done
for t in tests/*.test.mjs; do
  [ -f "$t" ] || continue
  [ -n "${DS_SKIP_NODE:-}" ] && continue
  run_one "$(basename "$t")" node "$t"
done
}
first=1
for b in "$@"; do
  if [ $first = 0 ]; then export DS_SKIP_FUZZ=1 DS_SKIP_CUDA_BUILD=1; fi
  case "$b" in
    *asan*) (export DS_ASAN=1 ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}; run_suite "$b"; echo "$pass $fail" >"$log.counts") ;;
    *) run_suite "$b"; echo "$pass $fail" >"$log.counts" ;;
  esac
  read -r pass fail <"$log.counts"
  first=0
done
rm -f "$log" "$log.counts"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
