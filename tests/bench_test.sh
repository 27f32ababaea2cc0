#!/usr/bin/env bash
# bench_test — CI smoke test of the benchmark harness on the CPU: `deltaserve bench --quick` on a
# tiny random model must write JSON with the commit, the device, the peers and every metric
# key as a finite number (and ratios for every peer figure); report.py must turn it into
# Markdown without matplotlib; serve_load.mjs must drive a served tiny model and report
# finite latency figures. No timing assertions.
set -u
cd "$(dirname "$0")/.."
BIN=${DS_BUILD:-build}/deltaserve
if [ ! -x "$BIN" ]; then echo "FAIL bench: $BIN not built"; exit 1; fi
if ! "$BIN" bench --help >/dev/null 2>&1; then echo "FAIL bench: '$BIN bench' is not a command"; exit 1; fi
tmp=$(mktemp -d)
spid=""
cleanup() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

if ! "$BIN" gen-random --config scripts/bench/tiny-config.json --out "$tmp/m" --seed 3 >"$tmp/gen.log" 2>&1; then
  echo "FAIL bench_gen_random: $(tail -1 "$tmp/gen.log")"; exit 1
fi
if "$BIN" bench --model "$tmp/m" --device cpu --threads 2 --quick --commit 0123456789abcdef0123456789abcdef01234567 \
    --out "$tmp/b.json" >"$tmp/bench.log" 2>&1; then
  echo "PASS bench_runs"
else
  echo "FAIL bench_runs: exit status $?"; tail -5 "$tmp/bench.log"
fi
if [ ! -f "$tmp/b.json" ]; then echo "FAIL bench_json_written"; exit 1; fi

# Usage errors: no --out, an unknown flag.
"$BIN" bench --model "$tmp/m" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && echo "PASS bench_usage_missing_out" || echo "FAIL bench_usage_missing_out: exit $rc"
"$BIN" bench --model "$tmp/m" --out "$tmp/x.json" --bogus 1 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && echo "PASS bench_usage_unknown_flag" || echo "FAIL bench_usage_unknown_flag: exit $rc"
"$BIN" bench --model "$tmp/m" --out "$tmp/x.json" --decode-conc 8 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && echo "PASS bench_decode_conc_needs_only" || echo "FAIL bench_decode_conc_needs_only: exit $rc"
"$BIN" bench --model "$tmp/m" --out "$tmp/x.json" --only decode --decode-conc 5000 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && echo "PASS bench_decode_conc_too_many" || echo "FAIL bench_decode_conc_too_many: exit $rc"
# conc_case NAME N CHECK: `--only decode --decode-conc N` on the CPU must exit 0 and its metrics m
# satisfy the JavaScript expression CHECK (d: the whole JSON).
conc_case() {
  if "$BIN" bench --model "$tmp/m" --device cpu --threads 2 --quick --only decode --decode-conc "$2" \
      --out "$tmp/c$2.json" >"$tmp/conc$2.log" 2>&1 &&
     node -e 'const d=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8")), m=d.metrics;
       process.exit(eval(process.argv[2]) ? 0 : 1)' "$tmp/c$2.json" "$3"; then
    echo "PASS $1"
  else
    echo "FAIL $1"; tail -3 "$tmp/conc$2.log"
  fi
}
# A concurrency that is not one of the sizes: its own figure, decode_tok_s_N.
conc_case bench_decode_conc_other_size 3 'm.decode_tok_s_3 > 0 && m.decode_tok_s_1 === null && m.decode_tok_s_8 === null'
# The memory plan holds the sequences the timed level runs, not the largest size's (state slots).
conc_case bench_decode_conc_plans_its_sequences 3 'd.info.phase_a_engine.max_num_seqs === 3'
# One decode size only: that figure is a number, the other decode figures are null.
conc_case bench_decode_conc_one_size 8 'm.decode_tok_s_8 > 0 && m.decode_tok_s_1 === null && m.decode_tok_s_128 === null'

# Decode over a shared prefix: the runs' prompts share their first S tokens, prefix caching is
# on, and the prefix is restored (hit tokens) rather than computed for every request.
if "$BIN" bench --model "$tmp/m" --device cpu --threads 2 --quick --only decode --decode-conc 8 \
    --decode-prompt 200 --decode-shared 150 --out "$tmp/sh.json" >"$tmp/sh.log" 2>&1 &&
   node -e 'const d=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
     const st=d.info.decode_prefix_stats||{};
     process.exit(d.metrics.decode_tok_s_8 > 0 && d.info.decode_shared_prefix === 150 &&
       d.info.phase_a_engine.prefix_caching === true && st.prefix_hit_tokens >= 8 * 150 ? 0 : 1)' "$tmp/sh.json"; then
  echo "PASS bench_decode_shared_prefix"
else
  echo "FAIL bench_decode_shared_prefix"; tail -3 "$tmp/sh.log"
fi
"$BIN" bench --model "$tmp/m" --out "$tmp/x.json" --only decode --decode-prompt 100 --decode-shared 100 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && echo "PASS bench_decode_shared_below_prompt" || echo "FAIL bench_decode_shared_below_prompt: exit $rc"

# Repeated decode runs: the figure is the median of the runs listed in info.
if "$BIN" bench --model "$tmp/m" --device cpu --threads 2 --quick --only decode --decode-conc 8 \
    --decode-repeats 3 --out "$tmp/r.json" >"$tmp/rep.log" 2>&1 &&
   node -e 'const d=JSON.parse(require("fs").readFileSync(process.argv[1],"utf8"));
     const runs=(d.info.decode_runs_tok_s||{})["8"]||[];
     const s=[...runs].sort((a,b)=>a-b);
     process.exit(runs.length === 3 && runs.every((x)=>x > 0) && Math.abs(d.metrics.decode_tok_s_8 - s[1]) < 1e-9 ? 0 : 1)' "$tmp/r.json"; then
  echo "PASS bench_decode_repeats_median"
else
  echo "FAIL bench_decode_repeats_median"; tail -3 "$tmp/rep.log"
fi
"$BIN" bench --model "$tmp/m" --out "$tmp/x.json" --decode-repeats 0 >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && echo "PASS bench_decode_repeats_range" || echo "FAIL bench_decode_repeats_range: exit $rc"

node - "$tmp/b.json" <<'JS'
const fs = require("fs");
const d = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const check = (name, ok, why) => console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${why}`);
const fin = (x) => typeof x === "number" && Number.isFinite(x);
const keys = [
  "decode_tok_s_1", "decode_tok_s_8", "decode_tok_s_32", "decode_tok_s_64", "decode_tok_s_128",
  "prefill_tok_s_512", "prefill_tok_s_4096", "prefill_tok_s_16384",
  "shared_prefix_8x12k_all_first_token_s", "warm_prefix_ttft_ms",
  "capture_pause_ms", "restore_pause_ms", "checkpoint_bytes",
  "roofline_bw_bytes_per_s", "roofline_flops_per_s",
  ...[1, 8, 32, 64, 128].flatMap((n) => [`decode_bytes_per_step_${n}`, `decode_ceiling_tok_s_${n}`, `decode_roofline_frac_${n}`,
    `decode_moved_bytes_per_step_${n}`, `decode_moved_ceiling_tok_s_${n}`, `decode_moved_roofline_frac_${n}`]),
  ...[512, 4096, 16384].flatMap((n) => [`prefill_flops_per_token_${n}`, `prefill_ceiling_tok_s_${n}`, `prefill_roofline_frac_${n}`]),
];
const m = d.metrics || {};
const bad = keys.filter((k) => !fin(m[k]));
check("bench_metrics_finite", bad.length === 0, `not finite numbers: ${bad.join(", ")}`);
const nonfinite = Object.entries(m).filter(([, v]) => !fin(v)).map(([k]) => k);
check("bench_all_metrics_numbers", nonfinite.length === 0, nonfinite.join(", "));
const pos = keys.filter((k) => fin(m[k]) && !(m[k] > 0) && !k.startsWith("capture") && !k.startsWith("restore"));
check("bench_metrics_positive", pos.length === 0, pos.join(", "));
check("bench_commit_from_flag", d.commit === "0123456789abcdef0123456789abcdef01234567", d.commit);
check("bench_gpu_cpu", d.gpu === "cpu", d.gpu);
check("bench_date", typeof d.date === "string" && !Number.isNaN(Date.parse(d.date)), d.date);
const pm = (d.peers && d.peers.metrics) || {};
check("bench_peers", pm.decode_tok_s_1 === 248 && pm.decode_tok_s_128 === 3788 && pm.prefill_tok_s_512 === 21759, JSON.stringify(pm));
const r = d.ratios || {};
const badr = Object.keys(pm).filter((k) => !fin(r[k]) || Math.abs(r[k] - m[k] / pm[k]) > 1e-6 * Math.abs(r[k]));
check("bench_ratios", badr.length === 0, badr.join(", "));
// Independent roofline check: the decode bytes grow by exactly 2*slot + ctx*KV per sequence.
const i = d.info || {};
const b1 = m.decode_bytes_per_step_1, b8 = m.decode_bytes_per_step_8;
check("bench_roofline_weights", Math.abs(b1 - i.weight_bytes - (b8 - i.weight_bytes) / 8) < 1e-6 * b1, `${b1} ${b8}`);
check("bench_roofline_state", (b1 - i.weight_bytes) > 2 * i.slot_bytes, `${b1} ${i.weight_bytes} ${i.slot_bytes}`);
// Bytes moved (CPU backend: no lm-head screen): the counted bytes without a separate
// embedding matrix (info.embed_bytes, 0 when tied) and with its n rows read, so
// counted - moved + n * row is embed_bytes at every n; above the state's bytes.
const dm = [1, 8, 32, 64, 128].map((n) => m[`decode_bytes_per_step_${n}`] - m[`decode_moved_bytes_per_step_${n}`] + n * i.vocab_row_bytes);
check("bench_roofline_moved", i.vocab_row_bytes > 0 && Number.isInteger(i.embed_bytes) &&
  dm.every((x) => Math.abs(x - i.embed_bytes) < 1e-6 * b1) && m.decode_moved_bytes_per_step_1 > 2 * i.slot_bytes,
  `${dm} ${i.embed_bytes} ${i.vocab_row_bytes}`);
check("bench_checkpoint_bytes_is_slot", m.checkpoint_bytes === i.slot_bytes, `${m.checkpoint_bytes} vs ${i.slot_bytes}`);
check("bench_prefix_stats", i.prefix_stats && i.prefix_stats.shared_wave && Number.isInteger(i.prefix_stats.shared_wave.prompt_tokens), JSON.stringify(i.prefix_stats));
// 8 requests of (prefix + suffix) tokens went through the engine.
const z = i.sizes || {};
const pp = i.pause_phase || {};
check("bench_pause_phase", pp.decoding === z.pause_bg && pp.captures >= 1 && pp.restores >= z.pause_pairs && pp.decode_tokens_in_window > 0 && fin(m.capture_pause_idle_ms) && fin(m.restore_pause_idle_ms), JSON.stringify(pp));
check("bench_prefix_prompt_tokens", i.prefix_stats && i.prefix_stats.shared_wave.prompt_tokens === z.prefix_n * (z.prefix_len + z.suffix_len), JSON.stringify(z));
JS

if command -v python3 >/dev/null; then
  if python3 scripts/bench/report.py --bench "$tmp/b.json" --out-prefix "$tmp/r/bench" --no-plots >"$tmp/table" 2>"$tmp/rep.log" &&
     grep -q '^| `decode_tok_s_128`' "$tmp/r/bench.md" && grep -q '^decode_tok_s_128 ' "$tmp/table"; then
    echo "PASS bench_report_markdown"
  else
    echo "FAIL bench_report_markdown"; tail -5 "$tmp/rep.log"
  fi
  # the ceilings a CUDA run measures (none on the CPU): a line under the roofline tables
  node -e 'const fs=require("fs");const d=JSON.parse(fs.readFileSync(process.argv[1],"utf8"));
    Object.assign(d.metrics,{ceiling_copy_bytes_per_s:4.1e12,ceiling_copy_of_roofline_bw:4.1/4.24,
      ceiling_gemm_flops_per_s:7.5e14,ceiling_gemm_of_roofline_flops:750/780});
    d.info.ceilings_note="measured";fs.writeFileSync(process.argv[2],JSON.stringify(d))' "$tmp/b.json" "$tmp/c.json"
  if python3 scripts/bench/report.py --bench "$tmp/c.json" --out-prefix "$tmp/r/ceil" --no-plots >/dev/null 2>"$tmp/rep3.log" &&
     grep -q '^Ceilings measured in this run: copy 4.1 TB/s (0.967 of 4.24), GEMM 750 TFLOP/s (0.962 of 780)' "$tmp/r/ceil.md" &&
     ! grep -q 'Ceilings measured' "$tmp/r/bench.md"; then
    echo "PASS bench_report_ceilings"
  else
    echo "FAIL bench_report_ceilings"; grep -i ceiling "$tmp/r/ceil.md" | head -2; tail -3 "$tmp/rep3.log"
  fi
  # repeated decode runs: listed under the table (the 8-sequence row has its three runs)
  if python3 scripts/bench/report.py --bench "$tmp/r.json" --out-prefix "$tmp/r/rep" --no-plots >/dev/null 2>"$tmp/rep2.log" &&
     grep -q 'median of repeated runs' "$tmp/r/rep.md" && grep -Eq '^\| 8 \| [0-9.,]+ / [0-9.,]+ / [0-9.,]+ \|$' "$tmp/r/rep.md"; then
    echo "PASS bench_report_decode_runs"
  else
    echo "FAIL bench_report_decode_runs"; tail -5 "$tmp/rep2.log"
  fi
else
  echo "PASS bench_report_skipped_no_python"
fi

# serve_load against a served tiny model (official openai client from node_modules).
if [ ! -d node_modules/openai ]; then echo "PASS bench_serve_load_skipped_no_openai"; exit 0; fi
"$BIN" serve --model "$tmp/m" --device cpu --threads 2 --port 0 --skip-tokenizer-init --kv-cache-tokens 4096 \
  --max-num-seqs 4 >"$tmp/serve.log" 2>&1 &
spid=$!
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/serve.log" | head -1)
  [ -n "$port" ] && break
  sleep 0.1
done
if [ -z "$port" ]; then echo "FAIL bench_serve_start"; tail -5 "$tmp/serve.log"; exit 1; fi
if node scripts/bench/serve_load.mjs --base-url "http://127.0.0.1:$port/v1" --out "$tmp/load.json" --label t \
    --clients 1,3 --requests-per-client 2 --prefix-tokens 64 --suffix-min 3 --suffix-max 9 --max-tokens 5 \
    --vocab 1024 --wait-health-s 60 >"$tmp/load.log" 2>&1; then
  echo "PASS bench_serve_load_runs"
else
  echo "FAIL bench_serve_load_runs"; tail -5 "$tmp/load.log"
fi
node - "$tmp/load.json" <<'JS'
const fs = require("fs");
const check = (name, ok, why) => console.log(ok ? `PASS ${name}` : `FAIL ${name}: ${why}`);
let d;
try { d = JSON.parse(fs.readFileSync(process.argv[2], "utf8")); } catch (e) { check("bench_serve_load_json", false, e.message); process.exit(0); }
const fin = (x) => typeof x === "number" && Number.isFinite(x);
const lv = d.levels || [];
check("bench_serve_load_levels", lv.length === 2 && lv[0].clients === 1 && lv[1].clients === 3, JSON.stringify(lv.map((l) => l.clients)));
for (const l of lv) {
  const keys = ["ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99", "output_tok_s", "cache_hit_rate_usage", "cache_hit_rate_metrics"];
  const bad = keys.filter((k) => !fin(l[k]));
  check(`bench_serve_load_finite_${l.clients}`, bad.length === 0 && l.errors === 0, `${bad.join(", ")} errors ${l.errors} ${l.first_error}`);
  // every request streamed exactly max_tokens tokens (ignore_eos), one TTFT each
  check(`bench_serve_load_tokens_${l.clients}`, l.output_tokens === 5 * l.requests && l.ttft_ms.length === l.requests,
    `${l.output_tokens} tokens for ${l.requests} requests`);
  check(`bench_serve_load_prompt_tokens_${l.clients}`, l.metrics_delta.prompt_tokens_total === l.prompt_tokens, JSON.stringify(l.metrics_delta));
}
JS
