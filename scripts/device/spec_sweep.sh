#!/usr/bin/env bash
# spec_sweep.sh — speculative decoding speed against a controlled acceptance on the GPU machine
# (after build-cuda exists): `deltaserve bench --only decode --spec-replay P` at a model shape,
# dummy weights, for each decode size; each run is the plain pass and the speculating pass of
# the same prompts in one process, so the speedup is a same-call ratio.
#   bash scripts/device/spec_sweep.sh SHAPE.json LAYERS QUANT "SIZES" "P ..." [K] [EXTRA FLAGS...]
# SIZES "all": one bench process over every decode size (1 8 32 64 128; one model load).
# LAYERS overrides num_hidden_layers (0: the file's); QUANT is bf16 or fp8 (--quantization fp8).
# DS_BIN: another deltaserve binary (an A/B against a build of the parent).
# Writes $OUT/sweep-<name>-<quant>-<n>-<P>.json / .log and prints one line per run.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-sweep-out}
mkdir -p "$OUT"
SHAPE=$1 LAYERS=$2 QUANT=$3 SIZES=$4 PS=$5 K=${6:-3}
shift 6 2>/dev/null || shift $#
export LD_LIBRARY_PATH=/tmp/ds-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NAME=$(basename "$SHAPE" .json)
[ "$LAYERS" = 0 ] || NAME=$NAME-L$LAYERS
M=/tmp/ds-sweep-$NAME
mkdir -p "$M"
python3 - "$SHAPE" "$LAYERS" "$M/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
if sys.argv[2] != "0":
    c["num_hidden_layers"] = int(sys.argv[2])
json.dump(c, open(sys.argv[3], "w"))
PY
q=()
[ "$QUANT" = fp8 ] && q=(--quantization fp8)
SPEC="{\"method\":\"ngram\",\"num_speculative_tokens\":$K,\"disable_by_batch_size\":4096}"
for n in $SIZES; do
  for p in $PS; do
    J=$OUT/sweep-$NAME-$QUANT-$n-k$K-p$p.json
    conc=(--decode-conc "$n")
    levels=$n
    [ "$n" = all ] && conc=() && levels="1 8 32 64 128"
    t0=$(date +%s)
    timeout 420 "${DS_BIN:-build-cuda/deltaserve}" bench --model "$M" --device cuda --load-format dummy "${q[@]}" \
      --only decode "${conc[@]}" --speculative-config "$SPEC" --spec-replay "$p" "$@" \
      --out "$J" >"${J%.json}.log" 2>&1
    rc=$?
    python3 - "$J" "$levels" "$rc" "$NAME $QUANT k=$K P=$p" "$(( $(date +%s) - t0 ))" <<'PY'
import json, sys
j, levels, rc, tag, s = sys.argv[1:]
try:
    m = json.load(open(j))["metrics"]
except Exception as e:
    print(f"{tag} {levels}: rc {rc} no json ({e}) {s} s"); sys.exit()
f = lambda v: "null" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
for n in levels.split():
    g = lambda k: m.get(f"{k}_{n}")
    print(f"{tag} n={n}: rc {rc} plain {f(g('decode_plain_tok_s'))} spec {f(g('decode_tok_s'))} "
          f"speedup {f(g('decode_spec_speedup'))} AL {f(g('decode_acceptance_length'))} "
          f"rate {f(g('decode_draft_acceptance_rate'))} ({s} s)")
PY
    [ $rc = 0 ] || tail -3 "${J%.json}.log"
  done
done
