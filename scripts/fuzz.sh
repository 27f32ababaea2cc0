#!/usr/bin/env bash
# fuzz.sh — builds and runs the libFuzzer targets of tests/fuzz/ (clang 14, ASan + UBSan).
#
#   scripts/fuzz.sh build               instrumented build-fuzz/libdeltaserve.a + every target
#   scripts/fuzz.sh run TARGET [SECS]   fuzz one target (default 60 s) from a temp copy of
#                                       tests/fuzz/corpus/TARGET; prints "execs N corpus M"
#                                       and exits non-zero on any crash, leak or UBSan report
#   scripts/fuzz.sh all [SECS]          build, then run every target one after another
#   scripts/fuzz.sh replay TARGET FILE.. run inputs once through a target (reproduce a crash)
#   scripts/fuzz.sh list                the target names
#
# The library is built by the project Makefile itself (BUILD=build-fuzz, clang,
# -fsanitize=fuzzer-no-link,address,undefined), so it holds exactly the objects of `make`:
# every src/**/*.c except main.c and src/backend/cuda/. Each target tests/fuzz/fuzz_T.c is
# linked with -fsanitize=fuzzer,address,undefined. Crashing inputs are saved in
# build-fuzz/artifacts/TARGET/ and their path is printed; the committed corpus never grows
# (fuzzing starts from a temp copy). Extra libFuzzer flags: FUZZ_FLAGS="...".
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build-fuzz
CC=${FUZZ_CC:-clang}
SAN="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
CFLAGS="${FUZZ_STRICT:+-DFUZZ_STRICT} -std=c11 -Wall -Wextra -Werror -Wno-unknown-warning-option -O1 -g -pthread -D_GNU_SOURCE -Isrc -Itests"
LDLIBS="-lmicrohttpd -ljansson -lpcre2-8 -lutf8proc -lm -lpthread"
JOBS=${FUZZ_JOBS:-2}

targets() { for f in tests/fuzz/fuzz_*.c; do b=$(basename "$f" .c); echo "${b#fuzz_}"; done; }

# The fuzzer runtime ships with clang (Debian: libclang-rt-14-dev, pulled in with clang).
check_runtime() {
  command -v "$CC" >/dev/null 2>&1 || { echo "fuzz: $CC not found (scripts/setup.sh installs clang)" >&2; return 1; }
  local rt
  rt=$("$CC" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
  if [ ! -f "$rt" ]; then
    rt=$(find /usr/lib/llvm-*/lib/clang -name 'libclang_rt.fuzzer-x86_64.a' 2>/dev/null | head -1)
  fi
  [ -n "$rt" ] && [ -f "$rt" ] || { echo "fuzz: clang's libFuzzer runtime is missing (apt-get install libclang-rt-14-dev)" >&2; return 1; }
}

build() {
  check_runtime
  make --no-print-directory -s -j"$JOBS" BUILD=$BUILD CC="$CC" \
    OPT="-O1 -fsanitize=fuzzer-no-link $SAN -Wno-unknown-warning-option" \
    $BUILD/libdeltaserve.a
  mkdir -p $BUILD/fuzz
  local t
  for t in $(targets); do
    local src=tests/fuzz/fuzz_$t.c bin=$BUILD/fuzz/fuzz_$t
    if [ ! -x "$bin" ] || [ "$src" -nt "$bin" ] || [ tests/fuzz/fuzz_common.h -nt "$bin" ] ||
       [ $BUILD/libdeltaserve.a -nt "$bin" ]; then
      # shellcheck disable=SC2086
      $CC $CFLAGS -fsanitize=fuzzer $SAN "$src" $BUILD/libdeltaserve.a -o "$bin" $LDLIBS
    fi
  done
}

# run TARGET SECS: prints the libFuzzer log tail on failure; on success "execs N corpus M".
run() {
  local t=$1 secs=${2:-60}
  local bin=$BUILD/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: $bin not built" >&2; return 1; }
  local base=${TMPDIR:-/tmp}
  [ -d /dev/shm ] && [ -w /dev/shm ] && base=/dev/shm
  local work; work=$(mktemp -d "$base/ds-fuzz-$t.XXXXXX")
  mkdir -p "$work/corpus" $BUILD/artifacts/"$t"
  if [ -d tests/fuzz/corpus/"$t" ]; then cp -r tests/fuzz/corpus/"$t"/. "$work/corpus/"; fi
  local dict=""
  [ -f tests/fuzz/"$t".dict ] && dict="-dict=tests/fuzz/$t.dict"
  local rc=0
  # shellcheck disable=SC2086
  DS_FUZZ_TMP="$work" ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin" -max_total_time="$secs" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=25 \
      -print_final_stats=1 -artifact_prefix=$BUILD/artifacts/"$t"/ $dict ${FUZZ_FLAGS:-} \
      "$work/corpus" >"$work/log" 2>&1 || rc=$?
  local execs corpus
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/log" | grep -o '[0-9]*$' | tail -1 || true)
  corpus=$(find "$work/corpus" -type f | wc -l)
  if [ "$rc" -ne 0 ] || grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|FUZZ_CHECK failed' "$work/log"; then
    echo "fuzz $t: exit $rc after ${execs:-?} execs" >&2
    grep -E 'ERROR:|runtime error:|FUZZ_CHECK|SUMMARY|artifact|Test unit written|#[0-9]+ in ' "$work/log" | head -40 >&2 || true
    echo "--- last lines of the libFuzzer log ---" >&2
    tail -5 "$work/log" >&2
    cp "$work/log" $BUILD/artifacts/"$t"/last.log
    rm -rf "$work"
    echo "execs ${execs:-0} corpus $corpus"
    return 1
  fi
  cp "$work/log" $BUILD/artifacts/"$t"/last.log
  rm -rf "$work"
  echo "execs ${execs:-0} corpus $corpus"
}

cmd=${1:-all}
case "$cmd" in
  list) targets ;;
  build) build ;;
  run) [ $# -ge 2 ] || { echo "usage: $0 run TARGET [SECS]" >&2; exit 2; }; run "$2" "${3:-60}" ;;
  replay)
    [ $# -ge 3 ] || { echo "usage: $0 replay TARGET FILE..." >&2; exit 2; }
    t=$2; shift 2
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} $BUILD/fuzz/fuzz_"$t" -runs=1 "$@" ;;
  all)
    build
    secs=${2:-60}; bad=0
    for t in $(targets); do
      if out=$(run "$t" "$secs"); then echo "$t: $out"; else echo "$t: FAILED ($out)"; bad=1; fi
    done
    exit $bad ;;
  *) echo "usage: $0 build | run TARGET [SECS] | all [SECS] | replay TARGET FILE.. | list" >&2; exit 2 ;;
esac
