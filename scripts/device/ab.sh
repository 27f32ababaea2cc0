#!/usr/bin/env bash
# ab.sh — A/B timing of CUDA backend builds on a random Qwen3.5-4B-shaped model, one command on
# the GPU machine (device tool, carry [".deb"]): the op tests first, then `deltaserve bench
# --only prefill|decode` once per setting and round, a table of the runs and a summary of the
# rounds at the end. The backend reads no environment switches: a variant is a build (a -D the
# variant's source reads; wrap the constant under test in #ifndef in the variant's tree) or
# another commit (scripts/device/parent_ab.sh). A variant becomes the default only after its
# op tests pass and it wins here (bench/NOTES.md keeps the record).
#   bash scripts/device/ab.sh                      # the default list below (the baselines)
#   DS_AB_BUILDS="v=-DMY_VARIANT=1" DS_AB="decode@v:" DS_AB_ROUNDS=4 bash scripts/device/ab.sh
# Each entry is part[@build]:VAR=VALUE[,VAR=VALUE...]; "part:" alone is the baseline of that part,
# added for every part the list names (and run once a round if the list names it too). DS_AB_BUILDS
# is a list of name=FLAG[,FLAG...]: each is built from this tree with those nvcc flags into
# build-ab-<name> (no op tests), and part@name entries time it. DS_AB_ROUNDS (1) runs the whole list that
# many times, one setting after another (single runs spread 3-5 %, and a drift within the call then
# moves every setting alike); scripts/device/ab_summary.py then prints each setting's mean per level
# and, for all but the baseline, its mean change against the baseline of the same round and how many
# rounds it was ahead. DS_AB_MODEL (/tmp/m4b) is generated when missing, from DS_AB_CONFIG
# (scripts/device/qwen35-4b-shape.json; e.g. scripts/device/qwen35-moe-shape.json with
# DS_AB_MODEL=/tmp/moe for the MoE shape; on the CPU scripts/bench/tiny-config.json);
# DS_AB_SKIP_OPS=1 skips the op
# tests; DS_AB_BUILD_OPS=1 also builds and runs each DS_AB_BUILDS variant's op tests
# (ops-<name>.log: a build flag's kernels against the CPU before they are timed);
# DS_AB_CONC=N times only the decode run of N sequences (`--decode-conc`);
# DS_AB_DECODE_ARGS adds bench flags to every decode run (e.g. "--decode-prompt 12500
# --decode-shared 12400": decode over a shared, cached prefix).
# DS_AB_KTRACE=1 also builds each binary the list uses with -DDS_KTRACE (the instrument build,
# `make cuda-ktrace`; build-kt, build-kt-<name>) and, after the rounds, runs one decode step
# trace per decode setting (`--decode-conc ${DS_AB_CONC:-1}`; the trace's "ktrace| " lines of
# its stderr into $OUT/kt-<n>.txt): each kernel's mean interval from its stamp to the next
# one's per step, appended to ab.txt (the first lines of each trace).
# DS_AB_DEVICE=cpu is a dry run of the script itself on the CPU backend (a tiny model, --quick;
# no op tests, no build variants, no traces): what CI runs.
# Writes $OUT/ab.txt (the runs, then the summary), $OUT/ab.tsv (round, part, setting, level,
# tok/s), the op-test log and one bench JSON per run.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-ab-out}
mkdir -p "$OUT"
CPU=0
[ "${DS_AB_DEVICE:-cuda}" = cpu ] && CPU=1
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
if [ $CPU = 1 ]; then
  B=build/deltaserve
  make -j"$(nproc)" build/deltaserve >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
  M=${DS_AB_MODEL:-/tmp/ds-ab-tiny}
  [ -f "$M/config.json" ] || $B gen-random --config "${DS_AB_CONFIG:-scripts/bench/tiny-config.json}" \
    --out "$M" --seed 3 >/dev/null
  BENCH_ARGS=(--device cpu --threads 2 --quick)
  [ -n "${DS_AB_BUILDS:-}" ] && { echo "ab.sh: DS_AB_BUILDS needs the CUDA build"; exit 2; }
  [ "${DS_AB_KTRACE:-0}" = 1 ] && { echo "ab.sh: DS_AB_KTRACE needs the CUDA build"; exit 2; }
else
  . scripts/device/deb_prefix.sh
  run_ops() { # <build dir> <log> <label>: the op tests of one build, counted
    timeout 300 "$1/tests/cuda/test_cuda_ops" >"$2" 2>&1
    echo "$3: $(grep -c '^PASS' "$2") passed, $(grep -c '^FAIL' "$2") failed"
    grep '^FAIL' "$2"
  }
  ds_deb_prefix
  B=build-cuda/deltaserve
  build_variant() { # <name> <flags>: build-ab-<name> (and its op tests, its traced build)
    local name=$1 flags=$2 targets=all
    [ "${DS_AB_BUILD_OPS:-0}" = 1 ] && targets="all cuda-tests"
    make CUDA=1 BUILD="build-ab-$name" NVCC="$NVCC ${flags//,/ }" -j"$(nproc)" $targets \
      >"$OUT/build-$name.log" 2>&1 || return 1
    if [ "${DS_AB_KTRACE:-0}" = 1 ]; then
      make CUDA=1 BUILD="build-kt-$name" NVCC="$NVCC -DDS_KTRACE ${flags//,/ }" -j"$(nproc)" all \
        >"$OUT/build-kt-$name.log" 2>&1 || return 1
    fi
  }
  # every build at once (nvcc spends most of a build in a few large files: one build leaves
  # most cores idle), then the failures' logs
  pids=() names=()
  make CUDA=1 -j"$(nproc)" all cuda-tests >"$OUT/build.log" 2>&1 &
  pids+=($!) names+=(build)
  for b in ${DS_AB_BUILDS:-}; do
    build_variant "${b%%=*}" "${b#*=}" &
    pids+=($!) names+=("build-${b%%=*}")
  done
  if [ "${DS_AB_KTRACE:-0}" = 1 ]; then
    make BUILD=build-kt NVCC="$NVCC" -j"$(nproc)" cuda-ktrace >"$OUT/build-kt.log" 2>&1 &
    pids+=($!) names+=(build-kt)
  fi
  bad=0
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}" || { echo "ab.sh: ${names[$k]} failed"; tail -20 "$OUT/${names[$k]}.log"; bad=1; }
  done
  [ $bad = 0 ] || exit 1
  if [ "${DS_AB_BUILD_OPS:-0}" = 1 ]; then
    for b in ${DS_AB_BUILDS:-}; do
      run_ops "build-ab-${b%%=*}" "$OUT/ops-${b%%=*}.log" "ops [${b%%=*}]"
    done
  fi
  if [ "${DS_AB_SKIP_OPS:-0}" != 1 ]; then
    run_ops build-cuda "$OUT/ops.log" ops
  fi
  M=${DS_AB_MODEL:-/tmp/m4b}
  [ -f "$M/config.json" ] || $B gen-random --config "${DS_AB_CONFIG:-scripts/device/qwen35-4b-shape.json}" \
    --out "$M" >/dev/null
  BENCH_ARGS=()
fi
CONC_ARGS=() # decode runs only
[ -n "${DS_AB_CONC:-}" ] && CONC_ARGS=(--decode-conc "$DS_AB_CONC")
[ -n "${DS_AB_DECODE_ARGS:-}" ] && read -ra _da <<<"$DS_AB_DECODE_ARGS" && CONC_ARGS+=("${_da[@]}")
LIST=${DS_AB:-"prefill: decode:"}
runs=""
for e in $LIST; do
  part=${e%%:*}
  part=${part%%@*}
  case " $runs " in *" $part: "*) ;; *) runs="$runs $part:" ;; esac
done
for e in $LIST; do # an entry listed again (the baseline named explicitly, too) runs once a round
  case " $runs " in *" $e "*) ;; *) runs="$runs $e" ;; esac
done
ROUNDS=${DS_AB_ROUNDS:-1}
: >"$OUT/ab.txt"
: >"$OUT/ab.tsv"
i=0
for ((r = 1; r <= ROUNDS; r++)); do
  for e in $runs; do
    head=${e%%:*} env_s=${e#*:}
    part=${head%%@*} build=""
    [ "$head" != "$part" ] && build=${head#*@}
    bin=$B
    [ -n "$build" ] && bin=build-ab-$build/deltaserve
    if [ ! -x "$bin" ]; then echo "ab.sh: no binary for '$e' (is '$build' in DS_AB_BUILDS?)"; exit 2; fi
    setting="${build:+[$build] }${env_s:-}"
    [ -n "$setting" ] || setting="(default)"
    i=$((i + 1))
    envs=()
    [ -n "$env_s" ] && IFS=, read -ra envs <<<"$env_s"
    args=("${BENCH_ARGS[@]}")
    [ "$part" = decode ] && args+=("${CONC_ARGS[@]}")
    log=$(env "${envs[@]}" timeout 240 "$bin" bench --model "$M" --only "$part" "${args[@]}" --out "$OUT/ab-$i.json" 2>&1)
    # "bench: decode 8 sequences: 1995.1 tok/s (...)" / "bench: prefill 512 tokens: 45347.8 tok/s (...)"
    rows=$(printf '%s\n' "$log" | awk -v p="$part" '$1 == "bench:" && $2 == p && $5 + 0 > 0 { print $3 "\t" $5 }')
    printf '%s\n' "$rows" | awk -F'\t' -v r="$r" -v p="$part" -v s="$setting" 'NF == 2 { print r "\t" p "\t" s "\t" $1 "\t" $2 }' >>"$OUT/ab.tsv"
    line=$(printf '%s\n' "$rows" | awk -F'\t' 'NF == 2 { printf "%s: %s ", $1, $2 }')
    [ -n "$line" ] || line="no figures ($(printf '%s\n' "$log" | tail -1))"
    printf '%-8s %-28s %s%s\n' "$part" "$setting" "$line" "$([ "$ROUNDS" -gt 1 ] && echo " (round $r)")" | tee -a "$OUT/ab.txt"
  done
done
python3 scripts/device/ab_summary.py "$OUT/ab.tsv" | tee -a "$OUT/ab.txt"
if [ "${DS_AB_KTRACE:-0}" = 1 ]; then # one traced decode run per decode setting of the list
  k=0
  for e in $runs; do
    head=${e%%:*} env_s=${e#*:}
    part=${head%%@*} build=""
    [ "$part" = decode ] || continue
    [ "$head" != "$part" ] && build=${head#*@}
    k=$((k + 1))
    bin=build-kt/deltaserve
    [ -n "$build" ] && bin=build-kt-$build/deltaserve
    envs=()
    [ -n "$env_s" ] && IFS=, read -ra envs <<<"$env_s"
    env "${envs[@]}" timeout 240 "$bin" bench --model "$M" \
      --only decode --decode-conc "${DS_AB_CONC:-1}" --out "$OUT/kt-$k.json" >"$OUT/kt-$k.log" 2>&1
    sed -n 's/^ktrace| //p' "$OUT/kt-$k.log" >"$OUT/kt-$k.txt"
    { echo "== kernel trace: ${build:+[$build] }${env_s:-(default)} (kt-$k.txt)"
      head -"${DS_AB_KTRACE_LINES:-18}" "$OUT/kt-$k.txt" 2>/dev/null || echo "no trace ($(tail -1 "$OUT/kt-$k.log"))"
    } | tee -a "$OUT/ab.txt"
  done
fi
