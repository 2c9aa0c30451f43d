#!/usr/bin/env bash
# Builds build/libhopper_attention.so (C ABI hopper_attention_fwd, capi.cu) from the engine's own
# kernel, engine/backend/cuda/hopper_attention.cu, for H100/H200 (sm_90a). The CUTLASS/CuTe
# headers come from the nvidia-cutlass wheel in .venv (tools/requirements.txt) or CUTLASS_INCLUDE.
# Extra arguments go to nvcc, before the include paths (an -I of theirs shadows the tree); LIB_OUT names another output file and SOURCES (space-separated
# paths) other sources: backward/build.sh builds the backward's library through this script.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
CUTLASS_INCLUDE="${CUTLASS_INCLUDE:-$(ls -d "$ROOT"/.venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)}"
[ -d "$CUTLASS_INCLUDE" ] || { echo "build.sh: no CUTLASS headers (set CUTLASS_INCLUDE)" >&2; exit 1; }
OUT="${LIB_OUT:-$HERE/build/libhopper_attention.so}"
read -r -a SRCS <<<"${SOURCES:-$ROOT/engine/backend/cuda/hopper_attention.cu $HERE/capi.cu}"
mkdir -p "$(dirname "$OUT")"
"$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
  -DNDEBUG -Xptxas -v -Xcompiler -fPIC -shared "$@" -I"$ROOT" -I"$CUTLASS_INCLUDE" \
  "${SRCS[@]}" -o "$OUT"
