#!/usr/bin/env bash
# Builds libhopper_attention.so (C ABI: hopper_attention_fwd) for H100/H200 (sm_90a).
# Needs CUTLASS/CuTe headers in <repo>/.cutlass/include (see README.md).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
mkdir -p "$HERE/build"
"$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
  -DNDEBUG -Xptxas -v -Xcompiler -fPIC -shared \
  -I"$ROOT/.cutlass/include" \
  "$HERE/hopper_fwd.cu" -o "${LIB_OUT:-$HERE/build/libhopper_attention.so}" -lcuda "$@"
