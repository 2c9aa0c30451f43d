#!/usr/bin/env bash
# Builds backward/build/libhopper_bwd.so (C ABI hopper_attention_bwd, capi_bwd.cu) from the
# engine's own backward, engine/backend/cuda/hopper_attention_bwd.cu (with hopper_attention.cu,
# whose shape checks it shares), for H100/H200 (sm_90a). The CUTLASS/CuTe headers come from the nvidia-cutlass wheel in .venv
# (tools/requirements.txt) or CUTLASS_INCLUDE. Extra arguments go to nvcc, e.g.
# -DITHACA_BWD_DQ_ATOMIC=1 (float4 atomics instead of the bulk reduce) or -DITHACA_BWD_DS_STSM=0;
# LIB_OUT names another output file.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
CUTLASS_INCLUDE="${CUTLASS_INCLUDE:-$(ls -d "$ROOT"/.venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)}"
[ -d "$CUTLASS_INCLUDE" ] || { echo "build.sh: no CUTLASS headers (set CUTLASS_INCLUDE)" >&2; exit 1; }
mkdir -p "$HERE/build"
"$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --expt-relaxed-constexpr \
  -DNDEBUG -Xptxas -v -Xcompiler -fPIC -shared -I"$ROOT" -I"$CUTLASS_INCLUDE" \
  "$ROOT/engine/backend/cuda/hopper_attention_bwd.cu" "$ROOT/engine/backend/cuda/hopper_attention.cu" \
  "$HERE/capi_bwd.cu" -o "${LIB_OUT:-$HERE/build/libhopper_bwd.so}" "$@"
