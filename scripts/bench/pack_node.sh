#!/usr/bin/env bash
# pack_node — here, before a device run of scripts/device/bench.sh: packs this machine's node
# binary and the openai npm package (without source maps, types and sources) into
# .carry/bench/ (git-ignored), about 25 MB, so that the serving load can run on a GPU machine
# that has no Node.js. Carry ".carry" in the device call; bench.sh unpacks them there.
# Idempotent: does nothing when both files are newer than their sources.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/bench
node_bin=$(command -v node)
if [ ! -f .carry/bench/node.xz ] || [ "$node_bin" -nt .carry/bench/node.xz ]; then
  echo "pack_node: compressing $node_bin"
  xz -T0 -6 -c "$node_bin" >.carry/bench/node.xz.tmp && mv .carry/bench/node.xz.tmp .carry/bench/node.xz
fi
if [ ! -d node_modules/openai ]; then
  echo "pack_node: node_modules/openai missing (run: make deps)" >&2
  exit 1
fi
if [ ! -f .carry/bench/openai.tar.xz ] || [ node_modules/openai/package.json -nt .carry/bench/openai.tar.xz ]; then
  echo "pack_node: packing node_modules/openai"
  tar -C node_modules --exclude='*.map' --exclude='*.d.ts' --exclude='*.d.mts' --exclude='openai/src' \
    -cJf .carry/bench/openai.tar.xz.tmp openai && mv .carry/bench/openai.tar.xz.tmp .carry/bench/openai.tar.xz
fi
du -sh .carry/bench/node.xz .carry/bench/openai.tar.xz
