#!/usr/bin/env bash
# spec_check.sh — speculative decoding on the GPU machine, after check.sh built build-cuda:
# tests/cuda/test_cuda_spec (and its memcheck), then `deltaserve bench --only decode` at a model
# shape (default the Qwen3.5-4B one), plain and with --speculative-config, same call, at the
# given decode sizes. Writes $OUT/spec-*.log / .json and prints one line per run.
#   bash scripts/device/spec_check.sh [shape.json] [sizes, e.g. "1 8 64"] [spec json ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-spec-out}
mkdir -p "$OUT"
SHAPE=${1:-scripts/device/qwen35-4b-shape.json}
SIZES=${2:-1 8}
shift 2 2>/dev/null || shift $#
export LD_LIBRARY_PATH=/tmp/ds-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout 300 build-cuda/tests/cuda/test_cuda_spec >"$OUT/spec-test.log" 2>&1
echo "test_cuda_spec rc $?: $(grep -c '^PASS' "$OUT/spec-test.log") PASS, $(grep -c '^FAIL' "$OUT/spec-test.log") FAIL"
grep -E "^(FAIL|SPEC .*pass=0)" "$OUT/spec-test.log" | head -20
if command -v compute-sanitizer >/dev/null && [ "${DS_NO_MEMCHECK:-0}" != 1 ]; then
  timeout 300 compute-sanitizer --tool memcheck --leak-check no build-cuda/tests/cuda/test_cuda_spec \
    >"$OUT/spec-memcheck.log" 2>&1
  echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' "$OUT/spec-memcheck.log" | tail -1)"
fi
NAME=$(basename "$SHAPE" .json)
M=/tmp/ds-spec-$NAME
mkdir -p "$M"
cp "$SHAPE" "$M/config.json"
SPECS=("$@")
[ ${#SPECS[@]} -gt 0 ] || SPECS=('{"method":"ngram","num_speculative_tokens":3}')
for n in $SIZES; do
  i=0
  for sp in none "${SPECS[@]}"; do
    J=$OUT/spec-$NAME-$n-$i.json
    args=()
    [ "$sp" = none ] || args=(--speculative-config "$sp")
    timeout 400 build-cuda/deltaserve bench --model "$M" --device cuda --load-format dummy \
      --only decode --decode-conc "$n" "${args[@]}" --out "$J" >"$OUT/spec-$NAME-$n-$i.log" 2>&1
    echo "$NAME n=$n spec=$sp: rc $? $(python3 -c "import json; d=json.load(open('$J')); m=d['metrics']; print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in m.items() if 'decode' in k or 'accept' in k or 'spec' in k})" 2>/dev/null)"
    grep -iE "error|refus|spec" "$OUT/spec-$NAME-$n-$i.log" | head -3
    i=$((i + 1))
  done
done
