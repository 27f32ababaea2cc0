#!/usr/bin/env bash
# ceiling.sh — builds one of the measurement programs written against nvcc alone
# (scripts/device/<name>.cu: gemv_ceiling, tma_ceiling) and runs it on the GPU machine (device
# tool, no carry needed), printing its table and writing $OUT/<name>-<date>-<commit>.json with
# "_" as "-" (copy it into bench/results/). DS_COMMIT names the commit when .git did not travel.
#   bash scripts/device/ceiling.sh gemv_ceiling     (or gemv_ceiling.sh, tma_ceiling.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
name=${1:?usage: ceiling.sh gemv_ceiling|tma_ceiling|packed_gemv}
[ -f "scripts/device/$name.cu" ] || { echo "ceiling.sh: no scripts/device/$name.cu"; exit 2; }
OUT=${OUT:-/tmp/ds-${name//_/-}-out}
mkdir -p "$OUT"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
COMMIT=${DS_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
BIN=/tmp/ds-${name//_/-}
"$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -o "$BIN" \
  "scripts/device/$name.cu" -lcublas || exit 2
"$BIN" --json "$OUT/${name//_/-}-$(date -u +%Y%m%d)-${COMMIT:0:12}.json"
