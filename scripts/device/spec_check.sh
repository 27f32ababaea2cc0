#!/usr/bin/env bash
# spec_check.sh — speculative decoding on the GPU machine, after check.sh built build-cuda:
# tests/cuda/test_cuda_spec (and its memcheck), then `deltaserve bench --only decode` at a model
# shape (default the Qwen3.5-4B one), plain and with --speculative-config, same call, at the
# given decode sizes. Writes $OUT/spec-*.log / .json and prints one line per run.
#   bash scripts/device/spec_check.sh [shape.json] [sizes, e.g. "1 8 64"] [spec json ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-spec-out}
mkdir -p "$OUT"
SHAPE=${1:-scripts/device/qwen35-4b-shape.json}
SIZES=${2:-1 8}
shift 2 2>/dev/null || shift $#
export LD_LIBRARY_PATH=/tmp/ds-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout 300 build-cuda/tests/cuda/test_cuda_spec >"$OUT/spec-test.log" 2>&1
echo "test_cuda_spec rc $?: $(grep -c '^PASS' "$OUT/spec-test.log") PASS, $(grep -c '^FAIL' "$OUT/spec-test.log") FAIL"
grep -E "^(FAIL|SPEC .*pass=0)" "$OUT/spec-test.log" | head -20
if command -v compute-sanitizer >/dev/null && [ "${DS_NO_MEMCHECK:-0}" != 1 ]; then
  timeout 300 compute-sanitizer --tool memcheck --leak-check no build-cuda/tests/cuda/test_cuda_spec \
    >"$OUT/spec-memcheck.log" 2>&1
  echo "memcheck rc $?: $(grep -E 'ERROR SUMMARY' "$OUT/spec-memcheck.log" | tail -1)"
fi
# the engine on CUDA: greedy tokens of 8 prompts (two of them repeating text, so n-gram drafts
# are accepted) plain, with n-gram drafts and with MTP drafts, over a gen-random model with an
# MTP head (tokens of the same prompts compared; a random head is rejected, so this checks the
# rollback paths; CUDA is not batch-invariant, so a near tie may differ: counted, not asserted)
G=/tmp/ds-spec-mtp
mkdir -p $G
cat >$G/config.json.in <<'JSON'
{"model_type":"qwen3_5_text","vocab_size":4096,"hidden_size":256,"intermediate_size":512,
 "num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":64,
 "linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":128,
 "linear_value_head_dim":128,"linear_conv_kernel_dim":4,"partial_rotary_factor":0.25,
 "tie_word_embeddings":false,"mtp_num_hidden_layers":1}
JSON
build-cuda/deltaserve gen-random --config $G/config.json.in --out $G/m --seed 3 >/dev/null 2>&1
python3 - $G/prompts.jsonl <<'PY'
import json, random, sys
r = random.Random(1)
with open(sys.argv[1], "w") as f:
    for i in range(8):
        p = [r.randrange(4096) for _ in range(40 + 9 * i)]
        if i < 2:
            p = (p[:12] * 8)[:90]
        f.write(json.dumps({"prompt_ids": p, "max_tokens": 48, "temperature": 0}) + "\n")
PY
for sp in none '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"prompt_lookup_max":4}' \
  '{"method":"mtp","num_speculative_tokens":2}'; do
  args=()
  [ "$sp" = none ] || args=(--speculative-config "$sp")
  tag=$(echo "$sp" | sed 's/.*method":"\([a-z]*\)".*/\1/')
  timeout 120 build-cuda/deltaserve run --model $G/m --device cuda --prompts-file $G/prompts.jsonl \
    "${args[@]}" --log-steps >"$OUT/spec-cli-$tag.jsonl" 2>"$OUT/spec-cli-$tag.err"
  echo "cli $tag: rc $? steps $(grep -c 'step' "$OUT/spec-cli-$tag.err") verify-pieces $(grep -o '~[0-9]' "$OUT/spec-cli-$tag.err" | wc -l)"
  grep -iE "error|fail" "$OUT/spec-cli-$tag.err" | head -3
done
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
ref = [json.loads(l)["token_ids"] for l in open(f"{o}/spec-cli-none.jsonl")]
for t in ("ngram", "mtp"):
    try:
        got = [json.loads(l)["token_ids"] for l in open(f"{o}/spec-cli-{t}.jsonl")]
    except Exception as e:
        print(f"cli {t}: no output ({e})"); continue
    same = sum(a == b for a, b in zip(ref, got))
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(ref, got)]
    print(f"cli {t}: {same}/{len(ref)} prompts with the plain tokens; first differing index {first}")
PY
NAME=$(basename "$SHAPE" .json)
M=/tmp/ds-spec-$NAME
mkdir -p "$M"
cp "$SHAPE" "$M/config.json"
SPECS=("$@")
[ ${#SPECS[@]} -gt 0 ] || SPECS=('{"method":"ngram","num_speculative_tokens":3}')
for n in $SIZES; do
  i=0
  for sp in none "${SPECS[@]}"; do
    J=$OUT/spec-$NAME-$n-$i.json
    args=()
    [ "$sp" = none ] || args=(--speculative-config "$sp")
    timeout 400 build-cuda/deltaserve bench --model "$M" --device cuda --load-format dummy \
      --only decode --decode-conc "$n" "${args[@]}" --out "$J" >"$OUT/spec-$NAME-$n-$i.log" 2>&1
    echo "$NAME n=$n spec=$sp: rc $? $(python3 -c "import json; d=json.load(open('$J')); m=d['metrics']; print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in m.items() if 'decode' in k or 'accept' in k or 'spec' in k})" 2>/dev/null)"
    grep -iE "error|refus|spec" "$OUT/spec-$NAME-$n-$i.log" | head -3
    i=$((i + 1))
  done
done
