#!/usr/bin/env bash
# tma_ceiling.sh — what the tensor memory accelerator can stream of a decode step's weights, by
# box shape and ring depth (see scripts/device/tma_ceiling.cu; a few seconds), one command on
# the GPU machine:
#   bash scripts/device/tma_ceiling.sh       (built and run by ceiling.sh)
exec bash "$(dirname "$0")/ceiling.sh" tma_ceiling
