#!/usr/bin/env bash
# goals.sh — the open FP8 and speculative-decoding goals in one GPU-machine call (device tool,
# carry [".deb"] after scripts/device/deps.sh ran here): builds build-cuda unless it exists, then
# runs the parts named (in this order, each only while DS_GOALS_BUDGET_S (540) seconds allow it):
#   spec27   27B shape, all 64 layers, FP8: --spec-replay 0.19 k = 3 at every decode size
#            (acceptance length ~3; plain and speculating in one process: spec_sweep.sh)
#   spec4    4B shape, bf16, the same sweep
#   moe35    Qwen3.5-35B-A3B shape, 40 layers: FP8 decode at every size, then bf16 decode 1
#   next80   Qwen3-Next-80B-A3B full shape, FP8 (dummy weights written FP8: ~80 GB host memory,
#            an H200 for the device memory): decode and prefill, peak RSS
#   bs/ab    4B FP8 decode 1 speculating against DS_BIN (another build, e.g. the parent's)
#   verify   what a verify step costs: the 4B bf16 and 27B FP8 sweeps at P = 1 (every draft
#            rejected: the speculating rate is 1 / verify step) at 1 and 64 sequences
#   lanes27  27B FP8 speculating at 128 sequences (keep lanes cut by memory)
#   pending  each bench/pending/*.patch applied to a copy of the tree, built, its op and
#            speculative-decoding tests run, then the 4B bf16 and 27B FP8 decode-1 sweeps
#            against this build in the same call (DS_BIN)
#   bash scripts/device/goals.sh "spec27 spec4 moe35"
# Writes $OUT/goals.txt (one line per run) and each run's JSON and log under $OUT/goals/, and
# $OUT/goals.tgz of them (the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-goals-out}
G=$OUT/goals
mkdir -p "$G"
T0=$(date +%s)
BUDGET=${DS_GOALS_BUDGET_S:-540}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "$*" | tee -a "$OUT/goals.txt"; }
. scripts/device/deb_prefix.sh
ds_deb_prefix
export LD_LIBRARY_PATH=/tmp/ds-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
say "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) commit: ${DS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
if [ ! -x build-cuda/deltaserve ]; then
  make CUDA=1 -j"$(nproc)" all >"$G/build.log" 2>&1 || { tail -20 "$G/build.log"; exit 1; }
  say "build: $(($(date +%s) - T0)) s"
fi
B=build-cuda/deltaserve
model() { # model NAME SHAPE [JSON merged into the config]
  mkdir -p "/tmp/ds-goal-$1"
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1])); c.update(json.loads(sys.argv[2])); json.dump(c,open(sys.argv[3],"w"))' \
    "$2" "${3:-{\}}" "/tmp/ds-goal-$1/config.json"
}
bench() { # bench TAG SECONDS ARGS...: one bench run, its decode and prefill figures
  local tag=$1 s=$2 t=$(date +%s)
  shift 2
  [ "$(left)" -gt 60 ] || { say "$tag: skipped ($(left) s left)"; return; }
  [ "$s" -lt "$(left)" ] || s=$(left)
  timeout "$s" /usr/bin/time -v $B bench --device cuda --load-format dummy "$@" --out "$G/$tag.json" \
    >"$G/$tag.log" 2>&1
  local rc=$?
  say "$tag: rc $rc $(($(date +%s) - t)) s $(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["metrics"]; print(" ".join(f"{k} {v:.1f}" for k, v in m.items() if isinstance(v, (int, float)) and k.startswith(("decode_tok_s", "prefill_tok_s"))))' "$G/$tag.json" 2>/dev/null) $(grep -o 'Maximum resident set size (kbytes): [0-9]*' "$G/$tag.log")"
  [ $rc = 0 ] || tail -3 "$G/$tag.log" | tee -a "$OUT/goals.txt"
}
sweep() { # sweep SHAPE LAYERS QUANT SIZES: spec_sweep.sh at P = 0.19, k = 3
  [ "$(left)" -gt 90 ] || { say "sweep $1 $3: skipped ($(left) s left)"; return; }
  OUT=$G timeout "$(left)" bash scripts/device/spec_sweep.sh "$1" "$2" "$3" "$4" 0.19 3 | tee -a "$OUT/goals.txt"
}
for part in ${1:-spec27 spec4 moe35 next80}; do
  case $part in
  spec27) sweep scripts/device/qwen35-27b-shape.json 64 fp8 all ;;
  spec4) sweep scripts/device/qwen35-4b-shape.json 0 bf16 all ;;
  moe35)
    model moe35 scripts/device/qwen35-moe-shape.json '{"num_hidden_layers": 40}'
    bench moe35-fp8-decode 240 --model /tmp/ds-goal-moe35 --quantization fp8 --only decode
    bench moe35-bf16-decode1 150 --model /tmp/ds-goal-moe35 --only decode --decode-conc 1 ;;
  next80)
    model next80 scripts/device/qwen3-next-80b-shape.json
    bench next80-fp8 330 --model /tmp/ds-goal-next80 --quantization fp8 ;;
  verify)
    sweep_p() { [ "$(left)" -gt 90 ] && OUT=$G timeout "$(left)" bash scripts/device/spec_sweep.sh "$@" | tee -a "$OUT/goals.txt"; }
    sweep_p scripts/device/qwen35-4b-shape.json 0 bf16 "1 64" 1 3
    sweep_p scripts/device/qwen35-27b-shape.json 64 fp8 "1 64" 1 3 ;;
  lanes27) sweep scripts/device/qwen35-27b-shape.json 64 fp8 128 ;;
  pending)
    for p in bench/pending/*.patch; do
      if [ ! -f "$p" ] || [ "$(left)" -le 200 ]; then continue; fi
      n=$(basename "$p" .patch) d=/tmp/ds-pending-$(basename "$p" .patch)
      rm -rf "$d" && mkdir -p "$d" && tar cf - --exclude=build-cuda --exclude=build --exclude=.deb . | (cd "$d" && tar xf -)
      (cd "$d" && patch -p1 -s <"$p" && make CUDA=1 -j"$(nproc)" all build-cuda/tests/cuda/test_cuda_ops \
        build-cuda/tests/cuda/test_cuda_spec >"$G/pending-$n-build.log" 2>&1) || { say "$n: does not build"; continue; }
      for t in test_cuda_ops test_cuda_spec; do
        (cd "$d" && timeout 150 "build-cuda/tests/cuda/$t" >"$G/pending-$n-$t.log" 2>&1)
        say "$n $t: rc $? $(grep -c '^PASS' "$G/pending-$n-$t.log") passed $(grep -c '^FAIL' "$G/pending-$n-$t.log") failed"
      done
      for s in "scripts/device/qwen35-4b-shape.json 0 bf16" "scripts/device/qwen35-27b-shape.json 64 fp8"; do
        for b in $B "$d/$B"; do
          [ "$(left)" -gt 90 ] || continue
          tag=$([ "$b" = "$B" ] && echo this || echo "$n")
          say "$n: $tag build"
          # shellcheck disable=SC2086
          OUT=$G/pending-$n-$tag DS_BIN=$b timeout "$(left)" \
            bash scripts/device/spec_sweep.sh $s 1 0.19 3 | tee -a "$OUT/goals.txt"
        done
      done
    done ;;
  ab)
    for b in "${DS_BIN:-}" $B; do
      [ -n "$b" ] && OUT=$G/ab-$(basename "$(dirname "$(dirname "$b")")") DS_BIN=$b \
        timeout "$(left)" bash scripts/device/spec_sweep.sh scripts/device/qwen35-4b-shape.json 0 fp8 1 0.19 3 |
        tee -a "$OUT/goals.txt"
    done ;;
  *) say "goals.sh: unknown part '$part'" ;;
  esac
done
(cd "$OUT" && tar czf goals.tgz goals.txt goals)
say "end: $(($(date +%s) - T0)) s"
