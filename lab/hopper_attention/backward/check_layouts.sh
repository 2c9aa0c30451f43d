#!/usr/bin/env bash
# Host-only checks, no GPU needed: layout_check.cu (the CuTe layouts: "ALL OK") and emulate.cu
# (the algorithm's index arithmetic and conventions through the same partitions, against a
# double-precision reference: "EMULATION OK"). Extra arguments go to nvcc (e.g.
# -DITHACA_BWD_M_DESC=1 to emulate that order).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
CUTLASS_INCLUDE="${CUTLASS_INCLUDE:-$(ls -d "$ROOT"/.venv/lib/python3*/site-packages/cutlass_library/source/include 2>/dev/null | head -1)}"
mkdir -p "$HERE/build"
for t in layout_check emulate; do
  "$NVCC" -O2 -gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr \
    -I"$ROOT" -I"$CUTLASS_INCLUDE" "$HERE/$t.cu" "$ROOT/engine/backend/cuda/hopper_attention.cu" \
    -o "$HERE/build/$t" "$@"
  "$HERE/build/$t"
done
