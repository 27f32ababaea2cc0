#!/usr/bin/env bash
# Every C, header and CUDA file is formatted as .clang-format says (make format fixes them).
cd "$(dirname "$0")/.."
[ -n "${DS_SKIP_CUDA_BUILD:-}" ] && exit 0 # once per run: the second suite skips it
command -v clang-format >/dev/null || { echo "FAIL format: clang-format is not installed"; exit 1; }
bad=$(find src tests scripts -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | sort |
  while read -r f; do clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || echo "$f"; done)
if [ -n "$bad" ]; then
  echo "FAIL format: $(echo "$bad" | wc -l) files differ from .clang-format (run make format):"
  echo "$bad" | head -20
  exit 1
fi
echo "PASS format: $(find src tests scripts -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh' | wc -l) files as .clang-format says"
