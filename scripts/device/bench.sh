#!/usr/bin/env bash
# bench.sh — deltaserve's benchmark in one command.
#
#   On the GPU machine (device tool; here first: bash scripts/device/deps.sh and, when that
#   machine has no Node.js, bash scripts/bench/pack_node.sh; then run with
#   carry [".deb", ".carry"] and DS_COMMIT=$(git rev-parse HEAD)):
#       bash scripts/device/bench.sh
#   Here, on the CPU (a tiny model, --quick sizes; checks the whole pipeline end to end):
#       bash scripts/device/bench.sh --cpu
#
# Steps: the Debian libraries from .deb/ unpacked into a private prefix (as check.sh does) ->
# make CUDA=1 -> gen-random of the Qwen3.5-4B shape (bf16) into /tmp -> deltaserve bench
# --device cuda -> deltaserve serve twice (prefix caching on, then off) driven by
# scripts/bench/serve_load.mjs -> scripts/bench/report.py. Writes under $OUT:
#   bench-<date>-<commit>.json / .md / -throughput.png / -ttft.png  (copy into bench/results/)
#   bench.log, serve-on.log, serve-off.log
# and prints a short table last. Meant to finish in about 8 minutes on an H200.
# The device tool stops a command at 10 minutes: every step after the build gets a timeout cut
# from DS_BENCH_BUDGET_S (540 s in all), so the report is always written.
# Knobs: DS_BENCH_CLIENTS (8,32,64), DS_BENCH_LEVEL_S (40), DS_BENCH_PORT (18080),
# DS_BENCH_BUDGET_S (540), DS_BIN (a deltaserve binary to use instead of building),
# DS_BENCH_SKIP_SERVE=1, DS_BENCH_DECODE_REPEATS (3: each decode level measured three times,
# the median reported; single runs spread 3-5 % on the H200).
set -uo pipefail
cd "$(dirname "$0")/../.."
MODE=cuda
[ "${1:-}" = "--cpu" ] && MODE=cpu
T0=$(date +%s)
since() { echo "$(( $(date +%s) - T0 )) s"; }
BUDGET=${DS_BENCH_BUDGET_S:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); } # seconds of the budget left

if [ $MODE = cuda ]; then
  OUT=${OUT:-/tmp/ds-bench-out}
else
  OUT=${OUT:-/tmp/ds-bench-cpu}
fi
mkdir -p "$OUT"
COMMIT=${DS_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
[[ "$COMMIT" =~ ^[0-9a-f]{7,40}$ ]] || COMMIT=unknown  # names of result files depend on it
export DS_COMMIT=$COMMIT
DATE=$(date -u +%Y%m%d-%H%M)
PREFIX=$OUT/bench-$DATE-${COMMIT:0:12}
PORT=${DS_BENCH_PORT:-18080}
PY=python3
# the plots need matplotlib; prefer an interpreter that has it
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import matplotlib' 2>/dev/null; then PY=$p; break; fi
done

# ---- build -------------------------------------------------------------------------------
if [ -n "${DS_BIN:-}" ]; then
  BIN=$DS_BIN
elif [ $MODE = cuda ]; then
  # Same approach as scripts/device/check.sh: Debian packages unpacked into a private prefix.
  . scripts/device/deb_prefix.sh
  ds_deb_prefix
  if ! make CUDA=1 -j"$(nproc)" build-cuda/deltaserve >"$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    echo "bench: build failed (see build.log)"
    exit 1
  fi
  BIN=build-cuda/deltaserve
else
  if ! make -j"$(nproc)" build/deltaserve >"$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    echo "bench: build failed"
    exit 1
  fi
  BIN=build/deltaserve
fi
echo "bench: built $BIN ($(since))"

# ---- model ---------------------------------------------------------------------------------
if [ $MODE = cuda ]; then
  CFG=scripts/device/qwen35-4b-shape.json
  MODEL=/tmp/ds-bench-4b
  DEVICE=cuda
  QUICK=""
else
  CFG=scripts/bench/tiny-config.json
  MODEL=/tmp/ds-bench-tiny
  DEVICE=cpu
  QUICK="--quick"
fi
if [ -f "$MODEL/model.safetensors" ] && cmp -s "$CFG" "$MODEL/config.json"; then
  echo "bench: reusing $MODEL"
elif ! timeout 300 "$BIN" gen-random --config "$CFG" --out "$MODEL" --dtype bf16 --seed 7 >"$OUT/genrandom.log" 2>&1; then
  tail -5 "$OUT/genrandom.log"
  echo "bench: gen-random failed"
  exit 1
fi
rm -f "$OUT/build.log" "$OUT/genrandom.log" # kept only on failure ($OUT returns at most 8 files)
VOCAB=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$CFG")
echo "bench: model $MODEL ($(since))"

# ---- offline bench -----------------------------------------------------------------------
BENCH_JSON=$OUT/bench-raw.json
BT=$(( $(left) - 40 )); [ $BT -gt 420 ] && BT=420; [ $BT -lt 30 ] && BT=30
timeout $BT "$BIN" bench --model "$MODEL" --device $DEVICE --out "$BENCH_JSON" $QUICK \
  --decode-repeats "${DS_BENCH_DECODE_REPEATS:-3}" --commit "$COMMIT" >"$OUT/bench.log" 2>&1
RC=$?
grep '^bench:' "$OUT/bench.log" || true
if [ $RC -ne 0 ]; then
  tail -5 "$OUT/bench.log"
  echo "bench: deltaserve bench exited with $RC"
fi
[ -f "$BENCH_JSON" ] || { echo "bench: no JSON from deltaserve bench"; exit 1; }
echo "bench: offline bench done ($(since))"

# ---- serving load --------------------------------------------------------------------------
SERVES=()
NODE=$(command -v node || true)
if [ -z "$NODE" ] && [ -f .carry/bench/node.xz ]; then
  mkdir -p /tmp/ds-node
  "$PY" -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    .carry/bench/node.xz /tmp/ds-node/node && chmod +x /tmp/ds-node/node && NODE=/tmp/ds-node/node
fi
if [ ! -d node_modules/openai ] && [ -f .carry/bench/openai.tar.xz ]; then
  mkdir -p node_modules
  "$PY" -c 'import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    .carry/bench/openai.tar.xz node_modules
fi
if [ "${DS_BENCH_SKIP_SERVE:-0}" = 1 ]; then
  echo "bench: serving load skipped (DS_BENCH_SKIP_SERVE=1)"
elif [ -z "$NODE" ] || [ ! -d node_modules/openai ]; then
  echo "bench: serving load skipped: no node or no node_modules/openai (run scripts/bench/pack_node.sh here and carry .carry)"
else
  if [ $MODE = cuda ]; then
    SERVE_FLAGS="--device cuda --max-num-seqs 64 --kv-cache-tokens $((64 * 12400 + 16384))"
    LOAD_FLAGS="--clients ${DS_BENCH_CLIENTS:-8,32,64} --requests-per-client 2 --prefix-tokens 12000
      --suffix-min 50 --suffix-max 200 --max-tokens 128 --level-time-s ${DS_BENCH_LEVEL_S:-40}"
  else
    SERVE_FLAGS="--device cpu --max-num-seqs 8 --kv-cache-tokens 8192"
    LOAD_FLAGS="--clients ${DS_BENCH_CLIENTS:-2,4} --requests-per-client 2 --prefix-tokens 200
      --suffix-min 5 --suffix-max 20 --max-tokens 8 --level-time-s ${DS_BENCH_LEVEL_S:-20}"
  fi
  for mode in on off; do
    if [ $mode = on ]; then PC=--enable-prefix-caching; else PC=--no-enable-prefix-caching; fi
    # this run's share of what is left (the second run gets all of the rest), minus the report
    LT=$(( $(left) - 20 )); [ $mode = on ] && LT=$(( LT / 2 ))
    if [ $LT -lt 30 ]; then echo "bench: serving run cache_$mode skipped: out of time budget"; continue; fi
    DL=$(( LT - ${DS_BENCH_LEVEL_S:-40} - 30 )); [ $DL -lt 1 ] && DL=1
    "$BIN" serve --model "$MODEL" --port "$PORT" --served-model-name bench --skip-tokenizer-init \
      $SERVE_FLAGS $PC >"$OUT/serve-$mode.log" 2>&1 &
    SPID=$!
    # shellcheck disable=SC2086
    timeout $LT "$NODE" scripts/bench/serve_load.mjs --base-url "http://127.0.0.1:$PORT/v1" \
      --model bench --label "cache_$mode" --vocab "$VOCAB" --wait-health-s 120 --deadline-s $DL $LOAD_FLAGS \
      --out "$OUT/serve-$mode.json" 2>&1 | grep -v '^$'
    kill "$SPID" 2>/dev/null
    wait "$SPID" 2>/dev/null
    if [ -f "$OUT/serve-$mode.json" ]; then
      SERVES+=(--serve "$OUT/serve-$mode.json")
    else
      echo "bench: serving run cache_$mode produced nothing; server log tail:"
      tail -5 "$OUT/serve-$mode.log"
    fi
  done
  echo "bench: serving load done ($(since))"
fi

# ---- report --------------------------------------------------------------------------------
"$PY" scripts/bench/report.py --bench "$BENCH_JSON" "${SERVES[@]}" --out-prefix "$PREFIX" >"$OUT/table.txt" 2>"$OUT/report.log"
RRC=$?
cat "$OUT/report.log"
rm -f "$BENCH_JSON" "$OUT"/serve-on.json "$OUT"/serve-off.json
echo "bench: total $(since); results in $OUT"
cat "$OUT/table.txt"
rm -f "$OUT/table.txt" "$OUT/report.log"
[ $RRC -eq 0 ] && [ $RC -eq 0 ]
