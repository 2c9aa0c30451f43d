#!/usr/bin/env bash
# Builds and runs layout_check.cu on the host (no GPU needed); prints "ALL OK" or the mismatches.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
CUTLASS_INCLUDE="${CUTLASS_INCLUDE:-$(ls -d "$ROOT"/.venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)}"
mkdir -p "$HERE/build"
"$NVCC" -gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr \
  -I"$ROOT" -I"$CUTLASS_INCLUDE" "$HERE/layout_check.cu" -o "$HERE/build/layout_check"
"$HERE/build/layout_check"
