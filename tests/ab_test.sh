#!/usr/bin/env bash
# ab_test — the A/B script of the GPU machine (scripts/device/ab.sh) on the CPU: its summary of
# paired rounds on rows whose means and ratios are worked out by hand below, then a dry run of
# the whole script (DS_AB_DEVICE=cpu, a tiny model, two rounds of one knob) that must write one
# row per round, setting and decode size and a summary pairing every size in both rounds, and
# a usage error for a build it was not given. No timing assertions.
set -u
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1: $2"; }

# 1. The summary. Level 1: baseline 100 / 200, setting 110 / 190 -> means 150.0 and 150.0,
#    ratios 1.10 and 0.95 -> mean +2.5 %, ahead in 1 of 2. Level 8: baseline 50 / 60, setting
#    only in round 1 at 45 -> ratio 0.90 -> -10.0 %, 0 of 1.
printf '1\tdecode\t(default)\t1\t100\n1\tdecode\t(default)\t8\t50\n1\tdecode\tX=1\t1\t110\n1\tdecode\tX=1\t8\t45\n2\tdecode\t(default)\t1\t200\n2\tdecode\t(default)\t8\t60\n2\tdecode\tX=1\t1\t190\n' >"$tmp/rows.tsv"
out=$(python3 scripts/device/ab_summary.py "$tmp/rows.tsv" 2>&1)
base=$(printf '%s\n' "$out" | grep '^decode *(default)')
knob=$(printf '%s\n' "$out" | grep '^decode *X=1')
case "$base" in
  *"1: 150.0 [100.0-200.0]"*"8: 55.0 [50.0-60.0]"*) pass ab_summary_baseline ;;
  *) fail ab_summary_baseline "got '$base'" ;;
esac
case "$knob" in
  *"1: 150.0 +2.5 % 1/2"*"8: 45.0 -10.0 % 0/1"*) pass ab_summary_paired ;;
  *) fail ab_summary_paired "got '$knob'" ;;
esac
case "$out" in
  *"summary over 2 round(s)"*) pass ab_summary_rounds ;;
  *) fail ab_summary_rounds "got '$(printf '%s\n' "$out" | head -1)'" ;;
esac
printf '1\tdecode\tonly four fields\n' >"$tmp/bad.tsv"
if python3 scripts/device/ab_summary.py "$tmp/bad.tsv" >/dev/null 2>"$tmp/bad.err"; then
  fail ab_summary_bad_row "a malformed row was accepted"
elif grep -q "bad row" "$tmp/bad.err"; then
  pass ab_summary_bad_row
else
  fail ab_summary_bad_row "$(head -1 "$tmp/bad.err")"
fi

# 2. The whole script on the CPU: 2 rounds x 2 settings x 5 decode sizes (the baseline named in the
#    list as well as added for its part: still one run of it a round).
if OUT=$tmp/ab DS_AB_DEVICE=cpu DS_AB_MODEL=$tmp/m DS_AB_ROUNDS=2 DS_AB="decode: decode:DS_NARROW=0" \
    bash scripts/device/ab.sh >"$tmp/ab.log" 2>&1; then
  pass ab_dry_run
else
  fail ab_dry_run "exit status $? ($(tail -1 "$tmp/ab.log"))"
fi
rows=$(wc -l <"$tmp/ab/ab.tsv" 2>/dev/null || echo 0)
[ "$rows" -eq 20 ] && pass ab_dry_run_rows || fail ab_dry_run_rows "$rows rows, expected 20"
knob=$(grep '^decode *DS_NARROW=0' "$tmp/ab/ab.txt" | grep -v 'round' | tail -1)
paired=$(printf '%s\n' "$knob" | grep -o ' [0-2]/2' | wc -l)
[ "$paired" -eq 5 ] && pass ab_dry_run_summary || fail ab_dry_run_summary "summary line '$knob'"

# 2b. DS_AB_DECODE_ARGS reaches every decode run: a shared prefix of 32 of 40 prompt tokens at
#     2 sequences, so each run's JSON names it and its prefix counters show restored tokens.
if OUT=$tmp/abd DS_AB_DEVICE=cpu DS_AB_MODEL=$tmp/m DS_AB_CONC=2 DS_AB="decode:" \
    DS_AB_DECODE_ARGS="--decode-prompt 40 --decode-shared 32" bash scripts/device/ab.sh >"$tmp/abd.log" 2>&1 &&
  got=$(python3 -c "import json, sys; i = json.load(open(sys.argv[1]))['info']; print(i.get('decode_shared_prefix'), i['decode_prefix_stats']['prefix_hit_tokens'] > 0)" "$tmp/abd/ab-1.json" 2>&1) &&
  [ "$got" = "32 True" ]; then
  pass ab_decode_args
else
  fail ab_decode_args "got '${got:-}' ($(tail -1 "$tmp/abd.log"))"
fi

# 2c. DS_AB_CONFIG: a missing model is generated from that shape (here the demo model's).
if OUT=$tmp/abc DS_AB_DEVICE=cpu DS_AB_MODEL=$tmp/mc DS_AB_CONFIG=scripts/demo-config.json DS_AB_CONC=1 \
    DS_AB="decode:" bash scripts/device/ab.sh >"$tmp/abc.log" 2>&1 &&
  got=$(python3 -c "import json, sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); print(a['vocab_size'] == b['vocab_size'] == 151936)" "$tmp/mc/config.json" scripts/demo-config.json 2>&1) &&
  [ "$got" = "True" ] && [ "$(wc -l <"$tmp/abc/ab.tsv")" -ge 1 ]; then
  pass ab_config
else
  fail ab_config "got '${got:-}' ($(tail -1 "$tmp/abc.log"))"
fi

# 3b. Kernel traces need the CUDA build: on the CPU a usage error before any run.
OUT=$tmp/ab3 DS_AB_DEVICE=cpu DS_AB_MODEL=$tmp/m DS_AB_KTRACE=1 DS_AB="decode:" bash scripts/device/ab.sh >"$tmp/ab3.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "DS_AB_KTRACE needs the CUDA build" "$tmp/ab3.log" && [ ! -s "$tmp/ab3/ab.tsv" ]; then
  pass ab_ktrace_needs_cuda
else
  fail ab_ktrace_needs_cuda "exit $rc ($(tail -1 "$tmp/ab3.log"))"
fi

# 3. A build variant that was not built: a usage error, not a silent baseline.
OUT=$tmp/ab2 DS_AB_DEVICE=cpu DS_AB_MODEL=$tmp/m DS_AB="decode@nope:" bash scripts/device/ab.sh >"$tmp/ab2.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "no binary for 'decode@nope:'" "$tmp/ab2.log"; then
  pass ab_unknown_build
else
  fail ab_unknown_build "exit $rc: $(tail -1 "$tmp/ab2.log")"
fi
