#!/usr/bin/env bash
# tma_ceiling.sh — what the tensor memory accelerator can stream of a decode step's weights, by
# box shape and ring depth (see scripts/device/tma_ceiling.cu), one command on the GPU machine
# (device tool, no carry needed):
#   bash scripts/device/tma_ceiling.sh
# Builds the program with nvcc, runs it (a few seconds), prints its table and writes
# $OUT/tma-ceiling-<date>-<commit>.json (copy it into bench/results/). DS_COMMIT names the
# commit when .git did not travel.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-tma-ceiling-out}
mkdir -p "$OUT"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
COMMIT=${DS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
BIN=/tmp/ds-tma-ceiling
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o "$BIN" \
  scripts/device/tma_ceiling.cu || exit 2
"$BIN" --json "$OUT/tma-ceiling-$(date -u +%Y%m%d)-${COMMIT:0:12}.json"
