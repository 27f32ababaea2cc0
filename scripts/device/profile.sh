#!/usr/bin/env bash
# profile.sh — per-kernel GPU time (Nsight Compute, clocks left alone) of the CUDA backend on a
# random Qwen3.5-4B-shaped model, one command on the GPU machine (device tool, carry [".deb"]):
#   bash scripts/device/profile.sh [prefill] [decode]
#   prefill: the first launches of `deltaserve bench --only prefill` (its warm-up: one
#            512-token prefill, then a few decode steps), DS_PROF_PREFILL_N launches (560:
#            about seven eighths of the 512-token forward);
#   decode:  launches DS_PROF_DECODE_SKIP.. of `deltaserve bench --only decode --decode-conc C`
#            (C = DS_PROF_DECODE_CONC, 1): the fused launches, each graph node one kernel,
#            i.e. decode steps of C sequences after the 16-token warm-up and the C prompts'
#            prefill (skip 7,000 at C = 1, 30,000 otherwise: at C = 64 windows from 20,000 to
#            60,000 were all decode steps; check the table for prefill kernels such as k_gdn_p3
#            at other C), DS_PROF_DECODE_N of them (800: about three steps at C = 1); the run
#            is cut after 150 s (the profiled range is over by then).
# Prints a table per part (scripts/device/ncu_sum.py: time, calls, mean per kernel name) and
# leaves the CSVs in $OUT. Builds (make CUDA=1) and generates the model when they are missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-profile-out}
mkdir -p "$OUT"
. scripts/device/deb_prefix.sh
ds_deb_prefix
B=build-cuda/deltaserve
make CUDA=1 -j"$(nproc)" all >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
M=${DS_PROF_MODEL:-/tmp/m4b}
[ -f "$M/config.json" ] || $B gen-random --config scripts/device/qwen35-4b-shape.json --out "$M" >/dev/null
NCU="ncu --clock-control none --csv --metrics gpu__time_duration.sum"
for part in "${@:-prefill}"; do
  case $part in
    prefill)
      timeout 300 $NCU -c "${DS_PROF_PREFILL_N:-560}" $B bench --model "$M" --only prefill \
        --out /tmp/prof.json >"$OUT/ncu-prefill.csv" 2>/dev/null ;;
    decode)
      C=${DS_PROF_DECODE_CONC:-1}
      skip=${DS_PROF_DECODE_SKIP:-$([ "$C" = 1 ] && echo 7000 || echo 30000)}
      timeout 150 $NCU -s "$skip" -c "${DS_PROF_DECODE_N:-800}" \
        $B bench --model "$M" --only decode --decode-conc "$C" --out /tmp/prof.json \
        >"$OUT/ncu-decode.csv" 2>/dev/null ;;
    *) echo "profile.sh: unknown part '$part'"; exit 2 ;;
  esac
  echo "== $part"
  python3 scripts/device/ncu_sum.py "$OUT/ncu-$part.csv" | head -40
done
