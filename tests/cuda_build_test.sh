#!/usr/bin/env bash
# The CUDA backend must compile (sm_90a) wherever nvcc exists; it runs on the GPU machine
# (scripts/device/check.sh). Prints PASS/FAIL like every test.
cd "$(dirname "$0")/.."
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
if [ -n "${DS_SKIP_CUDA_BUILD:-}" ]; then
  echo "note: CUDA build checked in the first suite"
  exit 0
fi
if [ ! -x "$NVCC" ] && ! command -v nvcc >/dev/null; then
  echo "note: no nvcc on this machine; CUDA build not checked"
  exit 0
fi
if make -j2 CUDA=1 BUILD=build-cuda all cuda-tests >/tmp/ds-cuda-build.log 2>&1; then
  echo "PASS cuda_build"
else
  tail -30 /tmp/ds-cuda-build.log
  echo "FAIL cuda_build: make CUDA=1 failed"
  exit 1
fi
