#!/usr/bin/env bash
# bench_spec_test — `deltaserve bench` with speculative decoding on the CPU fixture model: each
# decode size runs plain, then speculating on the same prompts; with --spec-replay P the drafts
# are the plain pass's own tokens, each corrupted with probability P. Checks what the engine
# does with them: P = 0 accepts every draft (acceptance length k + 1 but for the sequence ends),
# P = 1 none (exactly 1.0), a P between some; the speculative tokens equal the plain pass's
# (greedy and seeded sampling; MTP with its head running); the counters, the ratio and the
# printed table agree with the JSON; the flag's usage errors. No timing assertions.
set -u
cd "$(dirname "$0")/.."
BIN=${DS_BUILD:-build}/deltaserve
MODEL=tests/fixtures/models/dense_bf16
if [ ! -x "$BIN" ]; then echo "FAIL bench_spec: $BIN not built"; exit 1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# spec_case NAME MODEL SPEC_JSON CHECK [bench flags...]: the 8-sequence decode size only; CHECK
# is a JavaScript expression over m (metrics), s (info.spec), l (s.levels["8"]) and out (stdout).
spec_case() {
  local name=$1 model=$2 spec=$3 check=$4
  shift 4
  if "$BIN" bench --model "$model" --device cpu --threads 2 --quick --only decode --decode-conc 8 \
      --speculative-config "$spec" "$@" --out "$tmp/$name.json" >"$tmp/$name.out" 2>"$tmp/$name.log" &&
     node -e 'const fs=require("fs");const d=JSON.parse(fs.readFileSync(process.argv[1],"utf8"));
       const m=d.metrics, s=d.info.spec||{}, l=(s.levels||{})["8"]||{};
       const out=fs.readFileSync(process.argv[2],"utf8");
       const ok=eval(process.argv[3]);
       if(!ok) console.error(JSON.stringify({m:Object.fromEntries(Object.entries(m).filter(([k])=>/_8$/.test(k))),s}));
       process.exit(ok?0:1)' "$tmp/$name.json" "$tmp/$name.out" "$check" 2>>"$tmp/$name.log"; then
    echo "PASS $name"
  else
    echo "FAIL $name"; tail -4 "$tmp/$name.log"
  fi
}

K3='{"method": "ngram", "num_speculative_tokens": 3, "disable_by_batch_size": 1024}'
# the same figures and counters everywhere: tokens equal, the ratio is the two rates', the
# acceptance length is 1 + accepted / verify steps, the rate accepted / drafted (the JSON's
# numbers have 8 significant digits)
COMMON='l.mismatched_sequences === 0 && l.sequences % 8 === 0 && m.decode_plain_tok_s_8 > 0 &&
  Math.abs(m.decode_spec_speedup_8 - m.decode_tok_s_8 / m.decode_plain_tok_s_8) < 1e-6 * m.decode_spec_speedup_8 &&
  l.num_drafts > 0 && Math.abs(m.decode_acceptance_length_8 - (1 + l.num_accepted_tokens / l.num_drafts)) < 1e-6 &&
  Math.abs(m.decode_draft_acceptance_rate_8 - l.num_accepted_tokens / l.num_draft_tokens) < 1e-6 &&
  l.accepted_per_pos.reduce((a, b) => a + b, 0) === l.num_accepted_tokens'

# P = 0: every draft accepted; 8 tokens per sequence leave the last verify step short (k + 0.5)
spec_case bench_spec_replay_all_accepted "$MODEL" "$K3" \
  "$COMMON && l.sequences === 8 && s.replay_p === 0 && s.num_speculative_tokens === 3 && l.num_accepted_tokens === l.num_draft_tokens &&
   m.decode_acceptance_length_8 >= 3.5 && m.decode_acceptance_length_8 <= 4 && m.decode_draft_acceptance_rate_8 === 1 &&
   /^decode_acceptance_length_8 +[0-9.]+/m.test(out) && /^decode_plain_tok_s_8 /m.test(out)" --spec-replay 0
# P = 1: every draft corrupted, none accepted
spec_case bench_spec_replay_none_accepted "$MODEL" "$K3" \
  "$COMMON && s.replay_p === 1 && l.num_accepted_tokens === 0 && m.decode_acceptance_length_8 === 1 &&
   m.decode_draft_acceptance_rate_8 === 0" --spec-replay 1
# a P between: some drafts accepted, some not (a fixed hash: reproducible), over repeated runs
spec_case bench_spec_replay_some_accepted "$MODEL" "$K3" \
  "$COMMON && s.replay_p === 0.3 && l.sequences === 16 && m.decode_draft_acceptance_rate_8 > 0 &&
   m.decode_draft_acceptance_rate_8 < 1" --spec-replay 0.3 --decode-repeats 2
# seeded sampling is lossless too: the replayed sampled tokens are the ones drawn again
spec_case bench_spec_replay_sampled "$MODEL" "$K3" \
  "$COMMON && l.num_accepted_tokens === l.num_draft_tokens && m.decode_acceptance_length_8 >= 3.5" \
  --spec-replay 0 --temperature 0.8 --top-p 0.9
# n-gram drafts of their own (no replay): the acceptance is reported, the tokens are the plain ones
spec_case bench_spec_ngram "$MODEL" \
  '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2, "disable_by_batch_size": 1024}' \
  "$COMMON && s.method === 'ngram' && s.replay_p === null && m.decode_acceptance_length_8 >= 1 && m.decode_acceptance_length_8 <= 3"

# MTP: the head runs after each step, its drafts replaced by the replay
cat >"$tmp/mtp.json" <<'EOF'
{"model_type": "qwen3_5_text", "vocab_size": 256, "hidden_size": 48, "intermediate_size": 80,
 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
 "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.5,
 "tie_word_embeddings": false, "mtp_num_hidden_layers": 1}
EOF
if "$BIN" gen-random --config "$tmp/mtp.json" --out "$tmp/mtp" --threads 2 >"$tmp/gen.log" 2>&1; then
  spec_case bench_spec_replay_mtp "$tmp/mtp" '{"method": "mtp", "num_speculative_tokens": 2, "disable_by_batch_size": 1024}' \
    "$COMMON && s.method === 'mtp' && l.num_accepted_tokens === l.num_draft_tokens && m.decode_acceptance_length_8 >= 2.5" \
    --spec-replay 0
else
  echo "FAIL bench_spec_mtp_model: $(tail -1 "$tmp/gen.log")"
fi

# usage: no --speculative-config, out of range, no decode runs
usage_case() {
  local name=$1
  shift
  "$BIN" bench --model "$MODEL" --out "$tmp/x.json" "$@" >/dev/null 2>"$tmp/u.log"
  local rc=$?
  if [ $rc -eq 2 ] && grep -q -- '--spec-replay' "$tmp/u.log"; then echo "PASS $name"; else echo "FAIL $name: exit $rc $(tail -1 "$tmp/u.log")"; fi
}
usage_case bench_spec_replay_needs_config --spec-replay 0.5
usage_case bench_spec_replay_range --speculative-config "$K3" --spec-replay 1.5
usage_case bench_spec_replay_needs_decode --speculative-config "$K3" --spec-replay 0.5 --only prefill
