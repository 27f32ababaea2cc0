#!/usr/bin/env bash
# The CUDA backend must compile (sm_90a) wherever nvcc exists; it runs on the GPU machine
# (scripts/device/check.sh). So must the device tools built with nvcc alone
# (scripts/device/gemv_ceiling.cu, tma_ceiling.cu, packed_gemv.cu, fp8_gemv.cu: it links cuBLAS,
# its peer). Prints PASS/FAIL like every test.
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
NV=$NVCC
[ -x "$NV" ] || NV=nvcc
for t in gemv_ceiling tma_ceiling packed_gemv fp8_gemv; do
  if "$NV" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -o "/tmp/ds-$t-build" \
    "scripts/device/$t.cu" -lcublas >"/tmp/ds-$t-build.log" 2>&1; then
    echo "PASS ${t}_build"
  else
    tail -30 "/tmp/ds-$t-build.log"
    echo "FAIL ${t}_build: scripts/device/$t.cu does not compile"
    exit 1
  fi
done
