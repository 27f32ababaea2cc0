#!/usr/bin/env bash
# fuzz_test — the CI run of the libFuzzer targets (tests/fuzz/fuzz_*.c), one after another
# (CI has 2 cores): each fuzzes FUZZ_SECONDS (default 60) from a temp copy of its committed
# seed corpus with ASan + UBSan + LeakSanitizer and -rss_limit_mb=2048, and prints
#   PASS fuzz_<target> (N execs, M corpus)      or      FAIL fuzz_<target>: why
# Any crash, leak, UBSan report, contract check, timeout or OOM fails it; the crashing input
# is in build-fuzz/artifacts/<target>/ (turn it into tests/fuzz/regressions/<target>-<n>.bin).
# DS_SKIP_FUZZ=1 skips the whole file (prints nothing).
set -u
cd "$(dirname "$0")/.."
[ -n "${DS_SKIP_FUZZ:-}" ] && exit 0
secs=${FUZZ_SECONDS:-60}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

if ! bash scripts/fuzz.sh build >"$log" 2>&1; then
  if grep -q "fuzzer runtime is missing\|not found" "$log"; then
    # the runtime comes with clang (scripts/setup.sh installs it); try once, then give up
    bash scripts/setup.sh >/dev/null 2>&1 || true
  fi
  if ! bash scripts/fuzz.sh build >"$log" 2>&1; then
    echo "FAIL fuzz_build: scripts/fuzz.sh build failed"
    tail -20 "$log"
    exit 1
  fi
fi
echo "PASS fuzz_build"

rc=0
for t in $(bash scripts/fuzz.sh list); do
  if out=$(bash scripts/fuzz.sh run "$t" "$secs" 2>"$log"); then
    set -- $out # "execs N corpus M"
    echo "PASS fuzz_$t ($2 execs, $4 corpus)"
  else
    execs=$(echo "$out" | awk '{print $2}')
    why=$(grep -m1 -E 'FUZZ_CHECK failed|runtime error:|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' "$log" | cut -c1-300)
    echo "FAIL fuzz_$t: ${why:-fuzzer exited non-zero} (after ${execs:-?} execs)"
    cat "$log"
    rc=1
  fi
done
exit $rc
