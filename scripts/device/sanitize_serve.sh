#!/usr/bin/env bash
# sanitize_serve.sh — compute-sanitizer over a short serving run on the GPU.
#
#   On the GPU machine (device tool; carry [".deb"], DS_COMMIT=$(git rev-parse HEAD)):
#       bash scripts/device/sanitize_serve.sh
#   Here, on the CPU (the same request sequence against --device cpu, no sanitizer):
#       bash scripts/device/sanitize_serve.sh --dry-run
#
# Builds build-cuda/deltaserve as bench.sh does (DS_BIN=path skips the build), then serves the
# committed fixture model tests/fixtures/models/dense_bf16 (no tokenizer: --skip-tokenizer-init,
# token-id completions) with --device cuda twice: under `compute-sanitizer --tool memcheck`, then
# under `--tool racecheck`. Each run: /health polled up to DS_SAN_HEALTH_S (memcheck 150 s,
# racecheck 330 s: start-up under racecheck took 182 s at 132f6e2), then a fixed sequence of requests — non-streamed and streamed,
# three at once (greedy, sampled with top_p, logprobs), a stream cancelled after its first event,
# the same 300-token prompt twice (the second must hit the prefix cache), one more request after
# the cancellation —
# the wait for idle (/metrics), SIGTERM to the server, the sanitizer's summary lines parsed
# ("ERROR SUMMARY: N errors"; "RACECHECK SUMMARY: N hazards ..."). Each run is cut at
# DS_SAN_RUN_S (170 s; racecheck DS_SAN_RACE_RUN_S, 540 s); clients wait DS_SAN_CLIENT_S (300 s).
# Both runs take ~9 min: DS_SAN_TOOLS=racecheck (or memcheck) runs one within a 10-min call.
# Writes under $OUT: sanitize-serve-<date>-<commit12>.json
#   {commit, gpu, memcheck: {errors, requests_ok, ...}, racecheck: {hazards, requests_ok, ...}}
# and the tails of both runs' logs (sanitize-memcheck.log, sanitize-racecheck.log); prints a
# short table. Exit status: 0 clean, 1 errors / hazards / failed requests, 2 could not run (no
# compute-sanitizer, no GPU, build failed). Knobs: DS_SAN_PORT (18095), DS_SAN_RUN_S (170),
# DS_SAN_HEALTH_S (both runs; unset: 150 / 330), DS_SAN_LEAK_CHECK (no; full adds memcheck's leak check), DS_SAN_TOOLS
# ("memcheck racecheck"), DS_BIN, DS_COMMIT, OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
DRY=0
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "sanitize_serve: unknown argument '$a' (usage: sanitize_serve.sh [--dry-run])" >&2; exit 2 ;;
  esac
done
if [ $DRY = 1 ]; then OUT=${OUT:-/tmp/ds-sanitize-dry}; else OUT=${OUT:-/tmp/ds-sanitize-out}; fi
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/ds-sanitize.XXXXXX)
COMMIT=${DS_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}
[[ "$COMMIT" =~ ^[0-9a-f]{7,40}$ ]] || COMMIT=unknown
DATE=$(date -u +%Y%m%d-%H%M)
PORT=${DS_SAN_PORT:-18095}
URL=http://127.0.0.1:$PORT
RUN_S=${DS_SAN_RUN_S:-170}
# racecheck slows the server ~50x: its run and every client wait get longer ceilings (the H200
# run of 697f635 needed 180 s for the sequence; a 120 s client wait lost the cancel's first event)
RACE_RUN_S=${DS_SAN_RACE_RUN_S:-540}
CLIENT_S=${DS_SAN_CLIENT_S:-300}
export CLIENT_S # the node fallback reads it
MODEL=tests/fixtures/models/dense_bf16
cant() { echo "sanitize_serve: CANNOT RUN: $*"; exit 2; }

# ---- what it needs -------------------------------------------------------------------------
SAN=""
GPU="none (dry run)"
if [ $DRY = 0 ]; then
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    if [ -n "$c" ] && [ -x "$c" ]; then SAN=$c; break; fi
  done
  [ -n "$SAN" ] || cant "no compute-sanitizer on PATH or in /usr/local/cuda*/bin"
  GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  [ -n "$GPU" ] || cant "no GPU (nvidia-smi lists none)"
fi
CURL=$(command -v curl || true)
[ "${DS_SAN_NO_CURL:-0}" = 1 ] && CURL=""  # for testing the node path
NODE=$(command -v node || true)
if [ -z "$NODE" ] && [ -z "$CURL" ] && [ -f .carry/bench/node.xz ]; then
  # the node of scripts/bench/pack_node.sh, as bench.sh unpacks it
  mkdir -p /tmp/ds-node
  [ -x /tmp/ds-node/node ] || { python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],"wb"))' \
    .carry/bench/node.xz /tmp/ds-node/node.tmp && chmod +x /tmp/ds-node/node.tmp && mv /tmp/ds-node/node.tmp /tmp/ds-node/node; }
fi
[ -z "$NODE" ] && [ -x /tmp/ds-node/node ] && NODE=/tmp/ds-node/node
[ -n "$CURL" ] || [ -n "$NODE" ] || cant "neither curl nor node to send requests"

if [ -n "${DS_BIN:-}" ]; then
  BIN=$DS_BIN
elif [ $DRY = 0 ]; then
  . scripts/device/deb_prefix.sh
  ds_deb_prefix
  make CUDA=1 -j"$(nproc)" build-cuda/deltaserve >"$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; cant "build failed"; }
  BIN=build-cuda/deltaserve
else
  make -j"$(nproc)" build/deltaserve >"$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log"; cant "build failed"; }
  BIN=build/deltaserve
fi
[ -x "$BIN" ] || cant "no binary $BIN"

# ---- HTTP -------------------------------------------------------------------------------------
# post ROUTE BODY OUTFILE -> prints the HTTP status (000 when the connection failed)
post() {
  if [ -n "$CURL" ]; then
    curl -s -o "$3" -w '%{http_code}' --max-time "$CLIENT_S" -H 'Content-Type: application/json' -d "$2" "$URL$1" || true
  else
    "$NODE" -e '
      const [u, b, f] = process.argv.slice(1);
      fetch(u, { method: "POST", headers: { "Content-Type": "application/json" }, body: b, signal: AbortSignal.timeout(Number(process.env.CLIENT_S || 300) * 1000) })
        .then(async (r) => { require("fs").writeFileSync(f, await r.text()); process.stdout.write(String(r.status)); })
        .catch(() => process.stdout.write("000"));' "$URL$1" "$2" "$3"
  fi
}
# get ROUTE -> the body ("" when it failed); status in $GOT
get_status() {
  if [ -n "$CURL" ]; then curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$URL$1" || true
  else "$NODE" -e 'fetch(process.argv[1],{signal:AbortSignal.timeout(10000)}).then(r=>process.stdout.write(String(r.status)),()=>process.stdout.write("000"))' "$URL$1"; fi
}
get_body() {
  if [ -n "$CURL" ]; then curl -s --max-time 10 "$URL$1" || true
  else "$NODE" -e 'fetch(process.argv[1],{signal:AbortSignal.timeout(10000)}).then(r=>r.text()).then(t=>process.stdout.write(t),()=>{})' "$URL$1"; fi
}
# cancel ROUTE BODY -> prints the first SSE line, closing the connection right after it
cancel() {
  if [ -n "$CURL" ]; then
    curl -sN --max-time "$CLIENT_S" -H 'Content-Type: application/json' -d "$2" "$URL$1" 2>/dev/null | head -n 1
  else
    "$NODE" -e '
      const [u, b] = process.argv.slice(1), ac = new AbortController();
      fetch(u, { method: "POST", headers: { "Content-Type": "application/json" }, body: b, signal: ac.signal })
        .then(async (r) => { const rd = r.body.getReader(); const { value } = await rd.read();
          process.stdout.write(Buffer.from(value || []).toString().split("\n")[0] + "\n"); ac.abort(); process.exit(0); })
        .catch(() => process.exit(0));' "$URL$1" "$2"
  fi
}

# check_resp NAME STATUS FILE STREAM -> counts OK / failed requests
check_resp() {
  local name=$1 st=$2 f=$3 stream=$4 why=""
  if [ "$st" != 200 ]; then why="status $st: $(head -c 200 "$f" 2>/dev/null)"
  elif [ "$stream" = 1 ]; then
    grep -q '^data: \[DONE\]' "$f" || why="no [DONE]"
    grep -q '"error"' "$f" && why="error event: $(grep -m1 '"error"' "$f" | head -c 200)"
    grep -q '"finish_reason":"\(stop\|length\)"' "$f" || why="${why:-no finish_reason}"
    grep -q '"usage":{' "$f" || why="${why:-no usage}"
  else
    grep -q '"finish_reason":"\(stop\|length\)"' "$f" || why="no finish_reason: $(head -c 200 "$f")"
    grep -q '"usage":{' "$f" || why="${why:-no usage}"
  fi
  if [ -z "$why" ]; then REQ_OK=$((REQ_OK + 1)); else REQ_FAIL=$((REQ_FAIL + 1)); FAILS+=("$name: $why"); fi
}

ids() { # ids N SEED -> N comma-separated token ids in 3..250
  local n=$1 s=$2 i out=""
  for ((i = 0; i < n; i++)); do out+="$(( 3 + (i * 37 + s * 101) % 248 )),"; done
  echo "${out%,}"
}

# the request sequence against the server at $URL
requests() {
  local d=$WORK/r st
  mkdir -p "$d"
  st=$(post /v1/completions "{\"prompt\":[$(ids 16 1)],\"max_tokens\":8,\"temperature\":0}" "$d/1")
  check_resp plain "$st" "$d/1" 0
  st=$(post /v1/completions "{\"prompt\":[$(ids 24 2)],\"max_tokens\":8,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "$d/2")
  check_resp stream "$st" "$d/2" 1
  # three at once (wait on these three only: the server is a background job too)
  local w=()
  post /v1/completions "{\"prompt\":[$(ids 40 3)],\"max_tokens\":16,\"temperature\":0.8,\"top_p\":0.9,\"seed\":5,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "$d/3a" >"$d/3a.st" &
  w+=($!)
  post /v1/completions "{\"prompt\":[$(ids 12 4)],\"max_tokens\":16,\"logprobs\":2,\"temperature\":0}" "$d/3b" >"$d/3b.st" &
  w+=($!)
  post /v1/completions "{\"prompt\":[$(ids 70 5)],\"max_tokens\":12,\"ignore_eos\":true,\"return_token_ids\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "$d/3c" >"$d/3c.st" &
  w+=($!)
  wait "${w[@]}"
  check_resp concurrent_sampled "$(cat "$d/3a.st")" "$d/3a" 1
  check_resp concurrent_logprobs "$(cat "$d/3b.st")" "$d/3b" 0
  check_resp concurrent_ignore_eos "$(cat "$d/3c.st")" "$d/3c" 1
  # a stream cancelled after its first event
  local first
  first=$(cancel /v1/completions "{\"prompt\":[$(ids 20 6)],\"max_tokens\":400,\"ignore_eos\":true,\"stream\":true}")
  if [[ "$first" == "data: {"* ]]; then CANCEL_OK=true; REQ_OK=$((REQ_OK + 1)); else REQ_FAIL=$((REQ_FAIL + 1)); FAILS+=("cancel: first line '${first:0:120}'"); fi
  # the same long prompt twice: the second hits the prefix cache
  local P
  P=$(ids 300 7)
  st=$(post /v1/completions "{\"prompt\":[$P],\"max_tokens\":4,\"temperature\":0}" "$d/5a")
  check_resp prefix_first "$st" "$d/5a" 0
  st=$(post /v1/completions "{\"prompt\":[$P],\"max_tokens\":4,\"temperature\":0}" "$d/5b")
  check_resp prefix_second "$st" "$d/5b" 0
  PREFIX_CACHED=$(grep -o '"cached_tokens":[0-9]*' "$d/5b" 2>/dev/null | head -1 | cut -d: -f2)
  PREFIX_CACHED=${PREFIX_CACHED:-null}
  if [ "$PREFIX_CACHED" = null ] || [ "$PREFIX_CACHED" -eq 0 ]; then CHECK_FAIL=$((CHECK_FAIL + 1)); FAILS+=("prefix_second: no cached tokens ($PREFIX_CACHED)"); fi
  # still serving after the cancellation; then idle
  st=$(post /v1/completions "{\"prompt\":[$(ids 10 8)],\"max_tokens\":6,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "$d/6")
  check_resp after_cancel "$st" "$d/6" 1
  local i m
  for ((i = 0; i < 120; i++)); do
    m=$(get_body /metrics)
    if echo "$m" | grep -q '^deltaserve:num_requests_running{[^}]*} 0$' && echo "$m" | grep -q '^deltaserve:num_requests_waiting{[^}]*} 0$' &&
       echo "$m" | grep -q '^deltaserve:kv_pages_used{[^}]*} 0$' && echo "$m" | grep -q '^deltaserve:state_slots_used{[^}]*} 0$'; then
      IDLE=true; break
    fi
    sleep 0.5
  done
  [ $IDLE = true ] || { CHECK_FAIL=$((CHECK_FAIL + 1)); FAILS+=("not idle (running/waiting/pages/slots) 60 s after the requests"); }
  REQ_TOTAL=$((REQ_OK + REQ_FAIL))
}

# the pid of the deltaserve process under TOP (timeout -> [compute-sanitizer ->] deltaserve):
# the first descendant whose executable is deltaserve; TOP itself when there is none
server_pid() {
  local queue=("$1") p c
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do
      [ "$(basename "$(readlink "/proc/$c/exe" 2>/dev/null)")" = deltaserve ] && { echo "$c"; return; }
      queue+=("$c")
    done
  done
  echo "$1"
}

# one serving run: run_tool NAME  (NAME: memcheck | racecheck | dry)
RESULTS=()
run_tool() {
  local tool=$1 log=$WORK/$1.log t0 cmd=() top sp ok=0 rc summary errors hazards health_s exit_note
  health_s=${DS_SAN_HEALTH_S:-$([ "$tool" = racecheck ] && echo 330 || echo 150)}
  t0=$(date +%s)
  local serve=("$BIN" serve --model "$MODEL" --port "$PORT" --served-model-name fixture --skip-tokenizer-init
    --max-num-seqs 8 --kv-cache-tokens 16384 --gpu-memory-utilization 0.1)
  if [ "$tool" = dry ]; then
    cmd=("${serve[@]}" --device cpu)
    health_s=60
  elif [ "$tool" = memcheck ]; then
    cmd=("$SAN" --tool memcheck --leak-check "${DS_SAN_LEAK_CHECK:-no}" "${serve[@]}" --device cuda)
  else
    cmd=("$SAN" --tool racecheck "${serve[@]}" --device cuda)
  fi
  echo "sanitize_serve: $tool: ${cmd[*]}"
  # timeout signals its whole process group: the sanitizer and the server under it
  local run_s=$RUN_S
  [ "$tool" = racecheck ] && run_s=$RACE_RUN_S
  timeout -s KILL "$run_s" "${cmd[@]}" >"$log" 2>&1 &
  top=$!
  # wait for /health (the sanitizer makes start-up slow)
  local i
  for ((i = 0; i < health_s * 2; i++)); do
    kill -0 $top 2>/dev/null || break
    [ "$(get_status /health)" = 200 ] && { ok=1; break; }
    sleep 0.5
  done
  REQ_OK=0; REQ_FAIL=0; REQ_TOTAL=0; CHECK_FAIL=0; FAILS=(); PREFIX_CACHED=null; CANCEL_OK=false; IDLE=false
  if [ $ok = 1 ]; then
    echo "sanitize_serve: $tool: healthy after $(( $(date +%s) - t0 )) s"
    requests
  else
    FAILS=("the server did not become healthy within $health_s s")
    REQ_FAIL=1; REQ_TOTAL=1
  fi
  # SIGTERM to the server itself (the sanitizer then prints its summary and exits)
  sp=$(server_pid $top)
  kill -TERM "$sp" 2>/dev/null
  for ((i = 0; i < 120; i++)); do kill -0 $top 2>/dev/null || break; sleep 0.5; done
  if kill -0 $top 2>/dev/null; then kill -KILL "$sp" $top 2>/dev/null; exit_note="killed after 60 s"; fi
  wait $top
  rc=$?
  [ -n "${exit_note:-}" ] || exit_note="exit $rc"
  errors=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$log" | tail -1 | grep -o '[0-9]*')
  summary=$(grep -o '\(ERROR\|RACECHECK\) SUMMARY: .*' "$log" | tail -2 | tr '\n' ';' | sed 's/;$//')
  hazards=$(grep -o 'RACECHECK SUMMARY: [0-9]* hazard' "$log" | tail -1 | grep -o '[0-9]*')
  local secs=$(( $(date +%s) - t0 ))
  local fails_json
  fails_json=$(printf '%s\n' "${FAILS[@]}" | sed '/^$/d; s/\\/\\\\/g; s/"/\\"/g; s/\t/ /g' | head -10 | awk 'BEGIN{printf "["} {printf "%s\"%s\"", (NR>1?",":""), $0} END{printf "]"}')
  RESULTS+=("\"$tool\": {\"errors\": ${errors:-null}, \"hazards\": ${hazards:-null}, \"requests_ok\": $REQ_OK, \"requests_total\": $REQ_TOTAL, \"prefix_cached_tokens\": $PREFIX_CACHED, \"cancel_ok\": $CANCEL_OK, \"idle_after\": $IDLE, \"server\": \"$exit_note\", \"summary\": \"${summary//\"/}\", \"seconds\": $secs, \"failures\": $fails_json}")
  printf '  %-9s errors %-5s hazards %-5s requests %s/%s  prefix cached %s  %s  %s s  %s\n' "$tool" "${errors:--}" "${hazards:--}" \
    "$REQ_OK" "$REQ_TOTAL" "$PREFIX_CACHED" "$exit_note" "$secs" "${summary:-no sanitizer summary}"
  local f
  for f in "${FAILS[@]}"; do echo "    failed: $f"; done
  # the verdict of this run
  local good=1
  [ "$REQ_FAIL" = 0 ] && [ "$CHECK_FAIL" = 0 ] || good=0
  [ "$rc" = 0 ] || good=0
  case $tool in
    memcheck) [ "${errors:-x}" = 0 ] || good=0 ;;
    racecheck) # the hazards count when racecheck printed one, else its error summary
      if [ -n "$hazards" ]; then [ "$hazards" = 0 ] || good=0; elif [ "${errors:-x}" != 0 ]; then good=0; fi ;;
  esac
  [ $good = 1 ] || ALL_GOOD=0
  [ "$tool" = dry ] || tail -n 150 "$log" | tail -c 60000 >"$OUT/sanitize-$tool.log"
}

ALL_GOOD=1
T0=$(date +%s)
if [ $DRY = 1 ]; then
  run_tool dry
else
  for t in ${DS_SAN_TOOLS:-memcheck racecheck}; do run_tool "$t"; done
fi
JSON=$OUT/sanitize-serve-$DATE-${COMMIT:0:12}.json
[ $DRY = 1 ] && JSON=$OUT/sanitize-serve-dry-run.json
{
  printf '{"commit": "%s", "date": "%s", "gpu": "%s", "dry_run": %s, "model": "%s", "sanitizer": "%s", "pass": %s,\n' \
    "$COMMIT" "$DATE" "$GPU" "$([ $DRY = 1 ] && echo true || echo false)" "$MODEL" "$SAN" "$([ $ALL_GOOD = 1 ] && echo true || echo false)"
  (IFS=','; printf ' %s\n}\n' "${RESULTS[*]}")
} >"$JSON"
if command -v python3 >/dev/null && ! python3 -m json.tool "$JSON" >/dev/null 2>&1; then echo "sanitize_serve: warning: $JSON is not valid JSON"; fi
rm -rf "$WORK"
echo "sanitize_serve: $([ $ALL_GOOD = 1 ] && echo PASS || echo FAIL) in $(( $(date +%s) - T0 )) s; results in $OUT"
[ $ALL_GOOD = 1 ]
