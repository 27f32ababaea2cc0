#!/usr/bin/env bash
# The CUDA backend's checks, one command on the GPU machine (run through the device tool with
# carry [".deb"], after scripts/device/deps.sh ran here):
#   build (make CUDA=1) against the Debian libraries unpacked from .deb/ into a private prefix,
#   op tests (CUDA vs CPU), compute-sanitizer memcheck on them, model parity on the fixtures,
#   `deltaserve run --device cuda` when the CLI has it, and a timing table on a random
#   Qwen3.5-4B-shaped model (gen-random) unless DS_NO_BENCH=1.
# Then scripts/device/check_real.sh (real shapes, batch invariance, restore parity; DS_NO_REAL=1
# skips it), folded into the same JSON by scripts/device/check_merge.py.
# Knobs: DS_FAST=1 skips the shadow test and the CLI run; DS_NO_MEMCHECK=1 skips memcheck; DS_PROFILE=1 adds per-op
# tables (PROFILE lines).
# Writes $OUT/cuda-check-<date>-<commit>.json (copy it into bench/results/) and the logs, and
# prints a short table last. DS_COMMIT names the commit when .git did not travel (pass the full
# sha: DS_COMMIT=$(git rev-parse HEAD)).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-check-out}
mkdir -p "$OUT"
. scripts/device/deb_prefix.sh
ds_deb_prefix
COMMIT=${DS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
DATE=$(date -u +%Y%m%d)
JSON=$OUT/cuda-check-$DATE-$COMMIT.json
GPU=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "gpu: $GPU  commit: $COMMIT"

t0=$(date +%s)
if make CUDA=1 -j"$(nproc)" all cuda-tests >"$OUT/build.log" 2>&1; then BUILD=ok; else BUILD=failed; fi
echo "build: $BUILD ($(( $(date +%s) - t0 )) s)"
[ $BUILD = ok ] || tail -30 "$OUT/build.log"

OPS_P=0; OPS_F=0; SH_P=0; SH_F=0; MEMCHECK=not-run; PAR_P=0; PAR_F=0; PARITY_LINE=""; RUNCLI=not-run; BENCH=""
if [ $BUILD = ok ]; then
  timeout 300 build-cuda/tests/cuda/test_cuda_ops >"$OUT/ops.log" 2>&1
  cat "$OUT/ops.log"
  OPS_P=$(grep -c '^PASS' "$OUT/ops.log"); OPS_F=$(grep -c '^FAIL' "$OUT/ops.log")
  # FP8 K/V pages (--kv-cache-dtype fp8) against the CPU reference: docs/fp8.md
  timeout 300 build-cuda/tests/cuda/test_kv_fp8 >"$OUT/kv8.log" 2>&1
  cat "$OUT/kv8.log"
  KV8_P=$(grep -c '^PASS' "$OUT/kv8.log"); KV8_F=$(grep -c '^FAIL' "$OUT/kv8.log")

  if [ "${DS_NO_MEMCHECK:-0}" != 1 ] && command -v compute-sanitizer >/dev/null; then
    timeout 300 compute-sanitizer --tool memcheck --leak-check no build-cuda/tests/cuda/test_cuda_ops \
      >"$OUT/memcheck.log" 2>&1
    MEMCHECK=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$OUT/memcheck.log" | tail -1)
    [ -n "$MEMCHECK" ] || MEMCHECK="no summary (see memcheck.log)"
    grep -E '^(PASS|FAIL)' "$OUT/memcheck.log" | grep FAIL | head -5
  fi

  [ "${DS_FAST:-0}" = 1 ] || timeout 300 build-cuda/tests/cuda/test_cuda_shadow >"$OUT/shadow.log" 2>&1
  [ -f "$OUT/shadow.log" ] && cat "$OUT/shadow.log"
  SH_P=$(grep -c '^PASS' "$OUT/shadow.log" 2>/dev/null); SH_F=$(grep -c '^FAIL' "$OUT/shadow.log" 2>/dev/null)

  BM=""
  if [ "${DS_NO_BENCH:-0}" != 1 ]; then
    t1=$(date +%s)
    if timeout 240 build-cuda/deltaserve gen-random --config scripts/device/qwen35-4b-shape.json \
        --out /tmp/m4b >"$OUT/genrandom.log" 2>&1; then
      BM=/tmp/m4b
      echo "gen-random: $(( $(date +%s) - t1 )) s"
    else
      echo "gen-random failed: $(tail -2 "$OUT/genrandom.log")"
    fi
  fi
  DS_BENCH_MODEL=$BM timeout 400 build-cuda/tests/cuda/test_cuda_parity >"$OUT/parity.log" 2>&1
  cat "$OUT/parity.log"
  PAR_P=$(grep -c '^PASS' "$OUT/parity.log"); PAR_F=$(grep -c '^FAIL' "$OUT/parity.log")
  PARITY_LINE=$(grep '^PARITY' "$OUT/parity.log" | tail -1)
  BENCH=$(grep '^BENCH' "$OUT/parity.log")

  if [ "${DS_FAST:-0}" = 1 ]; then RUNCLI=skipped; elif build-cuda/deltaserve run --model tests/fixtures/models/dense_bf16 --prompt-ids "80,227,178,85,125,119" \
      --max-tokens 8 --device cuda >"$OUT/run.log" 2>&1; then
    RUNCLI="ok: $(tail -1 "$OUT/run.log")"
  else
    RUNCLI="unsupported or failed: $(tail -1 "$OUT/run.log")"
  fi
fi

python3 - "$JSON" <<PY
import json, sys
par = "$PARITY_LINE".split()
kv = dict(x.split("=", 1) for x in par[1:]) if par else {}
bench = [l[6:] for l in """$BENCH""".splitlines() if l.strip()]
d = {"commit": "$COMMIT", "gpu": "$GPU", "build": "$BUILD",
     "op_tests": {"passed": $OPS_P, "failed": $OPS_F},
     "kv_fp8_tests": {"passed": ${KV8_P:-0}, "failed": ${KV8_F:-0}},
     "shadow_ops_on_models": {"passed": ${SH_P:-0}, "failed": ${SH_F:-0}},
     "parity": {"passed": $PAR_P, "failed": $PAR_F, **kv},
     "memcheck": "$MEMCHECK", "run_cli": """$RUNCLI""", "timing": bench}
json.dump(d, open(sys.argv[1], "w"), indent=2)
PY
# the real-shape checks (transformers references, batch invariance, restore parity) in the same
# JSON: parity.{fixtures, real_shapes, batch_invariance, restore}; DS_NO_REAL=1 skips them
REAL_JSON=""
if [ "${DS_NO_REAL:-0}" != 1 ] && [ $BUILD = ok ]; then
  OUT=$OUT DS_COMMIT=$COMMIT bash scripts/device/check_real.sh >"$OUT/real-check.log" 2>&1
  REAL_JSON=$(ls -t "$OUT"/cuda-real-*-"$COMMIT".json 2>/dev/null | head -1)
  sed -n '/=== cuda real-shape check/,$p' "$OUT/real-check.log"
fi
python3 scripts/device/check_merge.py "$JSON" "$REAL_JSON"

echo
echo "=== cuda check $COMMIT on $GPU ==="
printf '%-10s %s\n' build "$BUILD" ops "passed $OPS_P failed $OPS_F" kv-fp8 "passed ${KV8_P:-0} failed ${KV8_F:-0}" shadow "passed $SH_P failed $SH_F" memcheck "$MEMCHECK" \
  parity "passed $PAR_P failed $PAR_F ${PARITY_LINE#PARITY }" run-cli "$RUNCLI"
echo "$BENCH"
echo "json: $JSON"
