#!/usr/bin/env bash
# Runs every test of deltaserve and ends with the line "N passed, N failed".
#   - C test binaries build/tests/test_* (each prints PASS/FAIL lines)
#   - shell tests tests/*_test.sh and node tests tests/*.test.mjs (same PASS/FAIL protocol)
# A binary that crashes or exits non-zero without a FAIL line counts as one failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
export DS_BUILD=$BUILD
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
rm -f "$log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
