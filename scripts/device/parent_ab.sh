#!/usr/bin/env bash
# parent_ab.sh — "performance must not move": `deltaserve bench` of a parent commit against this
# tree on the GPU machine, in paired rounds on one random Qwen3.5-4B-shaped model (decode 1 / 8 /
# 32 / 64 / 128 sequences, prefill 512 / 4096 / 16384 tokens). The parent's source travels as a
# git-ignored folder:
#   here:  mkdir -p .carry/parent && git archive <parent> src Makefile | tar -x -C .carry/parent
#   there: (device tool, carry [".deb", ".carry"])
#          DS_COMMIT=<head sha> DS_PARENT_COMMIT=<parent sha> bash scripts/device/parent_ab.sh
# Each round runs the parent and the head one after the other (the order alternates by round), so
# a drift of the machine within the call moves both alike; scripts/device/ab_summary.py prints each
# level's mean and the head's mean change against the parent of the same round. Writes $OUT/pab.txt
# (the runs, then the summary) and $OUT/pab.tsv. DS_PAB_ROUNDS (3), DS_PAB_BUDGET_S (540);
# DS_PAB_DEVICE=cpu is a dry run of the script itself here (CPU builds, a tiny model, --quick).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-pab-out}
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET=${DS_PAB_BUDGET_S:-540}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
PARENT=${DS_PARENT:-.carry/parent}
ROUNDS=${DS_PAB_ROUNDS:-3}
[ -f "$PARENT/Makefile" ] || { echo "parent_ab: no parent source in $PARENT"; exit 2; }
DEV=${DS_PAB_DEVICE:-cuda}
if [ "$DEV" = cuda ]; then
  . scripts/device/deb_prefix.sh
  ds_deb_prefix
  MK=(CUDA=1 BUILD=build-cuda)
  CFG=scripts/device/qwen35-4b-shape.json
  XARGS=()
else
  MK=(BUILD=build-pab)
  CFG=scripts/bench/tiny-config.json
  XARGS=(--quick --threads 2)
fi
J=$(($(nproc) / 2))
[ "$J" -ge 1 ] || J=1
(make -C "$PARENT" "${MK[@]}" -j"$J" all >"$OUT/build-parent.log" 2>&1
  echo $? >/tmp/pab-parent.rc) &
make "${MK[@]}" -j"$J" all >"$OUT/build-head.log" 2>&1
HRC=$?
wait
PRC=$(cat /tmp/pab-parent.rc)
if [ $HRC -ne 0 ] || [ "$PRC" -ne 0 ]; then
  tail -20 "$OUT/build-head.log" "$OUT/build-parent.log"
  echo "parent_ab: build failed (head $HRC, parent $PRC)"
  exit 1
fi
rm -f "$OUT/build-head.log" "$OUT/build-parent.log"
echo "parent_ab: built both ($(($(date +%s) - T0)) s)"
B=${MK[-1]#BUILD=}
M=/tmp/pab-model-$DEV
$B/deltaserve gen-random --config "$CFG" --out "$M" \
  --dtype bf16 --seed 7 >/dev/null 2>&1 || { echo "parent_ab: gen-random failed"; exit 1; }
echo "parent_ab: model ready ($(($(date +%s) - T0)) s)"
declare -A BIN=([parent]="$PARENT/$B/deltaserve" [head]=$B/deltaserve)
declare -A SETTING=([parent]="(default)" [head]="head")
TSV=$OUT/pab.tsv
: >"$TSV"
run() { # round side part
  local j=$OUT/r$1-$2-$3.json
  timeout $(($(left) > 200 ? 200 : $(left))) "${BIN[$2]}" bench --model "$M" --device "$DEV" \
    "${XARGS[@]}" --only "$3" --out "$j" >"$OUT/run.log" 2>&1 || { echo "  $2 $3 failed: $(tail -1 "$OUT/run.log")"; return; }
  python3 - "$j" "$1" "$3" "${SETTING[$2]}" >>"$TSV" <<'EOF'
import json, sys
path, rnd, part, setting = sys.argv[1:]
m = json.load(open(path))["metrics"]
for k, v in m.items():
    if k.startswith(part + "_tok_s_") and isinstance(v, (int, float)):
        print(f"{rnd}\t{part}\t{setting}\t{k.rsplit('_', 1)[1]}\t{v}")
EOF
  rm -f "$j"
}
for r in $(seq 1 "$ROUNDS"); do
  order="parent head"
  [ $((r % 2)) -eq 0 ] && order="head parent"
  for part in decode prefill; do
    for side in $order; do
      [ "$(left)" -gt 40 ] || { echo "parent_ab: out of time budget in round $r"; break 3; }
      run "$r" "$side" "$part"
    done
  done
  echo "parent_ab: round $r done ($(($(date +%s) - T0)) s)"
done
{
  echo "parent ${DS_PARENT_COMMIT:-?} = (default), head ${DS_COMMIT:-?} = head; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  cat "$TSV"
  echo
  python3 scripts/device/ab_summary.py "$TSV"
} >"$OUT/pab.txt"
rm -f "$OUT/run.log"
cat "$OUT/pab.txt"
