#!/usr/bin/env bash
# Builds backward/build/libhopper_bwd.so (C ABI hopper_attention_bwd, capi_bwd.cu) from the
# engine's own backward, engine/backend/cuda/hopper_attention_bwd.cu (with hopper_attention.cu,
# whose shape checks it shares), for H100/H200 (sm_90a), through ../build.sh (the same nvcc
# flags and CUTLASS headers as the forward). Extra arguments go to nvcc, e.g.
# -DITHACA_BWD_DQ_ATOMIC=1 (float4 atomics instead of the bulk reduce) or -DITHACA_BWD_DS_STSM=0;
# LIB_OUT names another output file.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
SOURCES="$ROOT/engine/backend/cuda/hopper_attention_bwd.cu $ROOT/engine/backend/cuda/hopper_attention.cu $HERE/capi_bwd.cu" \
  LIB_OUT="${LIB_OUT:-$HERE/build/libhopper_bwd.so}" exec "$HERE/../build.sh" "$@"
