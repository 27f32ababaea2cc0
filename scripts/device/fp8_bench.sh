#!/usr/bin/env bash
# fp8_bench.sh — bf16 against FP8 weights (--quantization fp8, 128 x 128 blocks) on the GPU
# machine, same call, alternating: `deltaserve bench --load-format dummy --only decode` and
# `--only prefill` at a model shape (default the Qwen3.5-4B one). Writes $OUT/fp8-bench-<shape>-*.json
# and prints one line per run. Needs a CUDA build in build-cuda.
#   bash scripts/device/fp8_bench.sh [shape.json] [rounds] [decode|prefill|both]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-fp8-bench-out}
mkdir -p "$OUT"
SHAPE=${1:-scripts/device/qwen35-4b-shape.json}
ROUNDS=${2:-1}
WHAT=${3:-both}
NAME=$(basename "$SHAPE" .json)
# the Debian libraries check.sh unpacked (libzmq's own dependencies are not on its runpath)
export LD_LIBRARY_PATH=/tmp/ds-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
M=/tmp/ds-fp8-$NAME
mkdir -p "$M"
cp "$SHAPE" "$M/config.json"
for r in $(seq 1 "$ROUNDS"); do
  for q in none fp8; do
    for only in decode prefill; do
      [ "$WHAT" = both ] || [ "$WHAT" = "$only" ] || continue
      [ "$only" = prefill ] && [ "$r" -gt 1 ] && continue
      J=$OUT/fp8-bench-$NAME-$q-$only-$r.json
      timeout 420 build-cuda/deltaserve bench --model "$M" --device cuda --load-format dummy \
        --quantization "$q" --only "$only" --out "$J" >"$OUT/fp8-bench-$NAME-$q-$only-$r.log" 2>&1
      echo "$NAME $q $only round $r: rc $? $(python3 -c "import json,sys; d=json.load(open('$J')); print({k: round(v) for k, v in d['metrics'].items() if isinstance(v, (int, float)) and k.startswith(('decode_tok_s', 'prefill_tok_s'))})" 2>/dev/null)"
      grep -iE "weights|fp8" "$OUT/fp8-bench-$NAME-$q-$only-$r.log" | head -3
    done
  done
done
