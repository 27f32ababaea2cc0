#!/usr/bin/env bash
# gemv_ceiling.sh — the kernel-per-product ceiling of a one-sequence decode step (see
# scripts/device/gemv_ceiling.cu), one command on the GPU machine (device tool, no carry needed):
#   bash scripts/device/gemv_ceiling.sh
# Builds the program with nvcc against the backend's device helpers (src/backend/cuda/
# cuda_common.cuh), runs it (about 10 s), prints its table and writes
# $OUT/gemv-ceiling-<date>-<commit>.json (copy it into bench/results/). DS_COMMIT names the
# commit when .git did not travel.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/ds-gemv-ceiling-out}
mkdir -p "$OUT"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
COMMIT=${DS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
BIN=/tmp/ds-gemv-ceiling
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc \
  -o "$BIN" scripts/device/gemv_ceiling.cu || exit 2
"$BIN" --json "$OUT/gemv-ceiling-$(date -u +%Y%m%d)-${COMMIT:0:12}.json"
