#!/usr/bin/env bash
# ab.sh — A/B timing of the CUDA backend's knobs on a random Qwen3.5-4B-shaped model, one command
# on the GPU machine (device tool, carry [".deb"]): the op tests first (they run every knob's
# variant against the CPU), then `deltaserve bench --only prefill|decode` once per setting, one
# table at the end. A knob is promoted to the default only after its op tests pass and it wins
# here (bench/NOTES.md keeps the record).
#   bash scripts/device/ab.sh                      # the default list below
#   DS_AB="prefill:DS_GDN_MMA=1 decode:DS_SGEMM_MAXT=0" bash scripts/device/ab.sh
# Each entry is part:VAR=VALUE[,VAR=VALUE...]; "part:" alone is the baseline of that part (added
# automatically). DS_AB_MODEL (/tmp/m4b) is generated when missing; DS_AB_SKIP_OPS=1 skips the
# op tests. Writes $OUT/ab.txt, the op-test log and one bench JSON per run.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-ab-out}
mkdir -p "$OUT"
. scripts/device/deb_prefix.sh
ds_deb_prefix
B=build-cuda/deltaserve
make CUDA=1 -j"$(nproc)" all cuda-tests >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
if [ "${DS_AB_SKIP_OPS:-0}" != 1 ]; then
  timeout 300 build-cuda/tests/cuda/test_cuda_ops >"$OUT/ops.log" 2>&1
  echo "ops: $(grep -c '^PASS' "$OUT/ops.log") passed, $(grep -c '^FAIL' "$OUT/ops.log") failed"
  grep '^FAIL' "$OUT/ops.log"
fi
M=${DS_AB_MODEL:-/tmp/m4b}
[ -f "$M/config.json" ] || $B gen-random --config scripts/device/qwen35-4b-shape.json --out "$M" >/dev/null
LIST=${DS_AB:-"prefill:DS_GDN_MMA=0 prefill:DS_GDN_MMA=1 prefill:DS_ATTN_FLASH=0 decode:DS_SGEMM_MAXT=0"}
runs="prefill: decode:"
for e in $LIST; do runs="$runs $e"; done
: >"$OUT/ab.txt"
i=0
for e in $runs; do
  part=${e%%:*} env_s=${e#*:}
  i=$((i + 1))
  envs=()
  [ -n "$env_s" ] && IFS=, read -ra envs <<<"$env_s"
  line=$(env "${envs[@]}" timeout 240 $B bench --model "$M" --only "$part" --out "$OUT/ab-$i.json" 2>&1 |
    grep "bench: $part" | sed -E 's/bench: (prefill|decode) //; s/ tok\/s.*//; s/ tokens:/:/; s/ sequences:/:/' | tr '\n' ' ')
  printf '%-8s %-24s %s\n' "$part" "${env_s:-(default)}" "$line" | tee -a "$OUT/ab.txt"
done
