#!/usr/bin/env bash
# gemv_ceiling.sh — the kernel-per-product ceiling of a one-sequence decode step (see
# scripts/device/gemv_ceiling.cu; about 10 s), one command on the GPU machine:
#   bash scripts/device/gemv_ceiling.sh      (built and run by ceiling.sh)
exec bash "$(dirname "$0")/ceiling.sh" gemv_ceiling
