#!/usr/bin/env bash
# s8 (issue 50): head_dim 64 in pairs of row blocks with 2 consumer warpgroups (128x128 tiles,
# 3 stages) instead of 3 (192x128) walked longest first. Builds, here (no GPU needed), the two
# libraries `run_device.sh hd64p` compares: build/libhopper_base.so from the engine's kernel as
# it is, build/libhopper_attention.so with notes/s8-hd64-pairs-2wg.patch applied to a copy.
# Carry lab/hopper_attention/build to the device.
set -euo pipefail
H="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$H/../.." && pwd)"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
LIB_OUT=$H/build/libhopper_base.so bash "$H/build.sh" > "$H/build/base.log" 2>&1
mkdir -p "$T/engine/backend/cuda"
cp "$ROOT"/engine/backend/cuda/hopper_attention.{cu,h} "$T/engine/backend/cuda/"
(cd "$T" && patch -s -p1 < "$H/notes/s8-hd64-pairs-2wg.patch")
# The patched copy's header shadows the tree's (-I order: the copy's folder first).
LIB_OUT=$H/build/libhopper_attention.so SOURCES="$T/engine/backend/cuda/hopper_attention.cu $H/capi.cu" \
  bash "$H/build.sh" -I"$T" > "$H/build/s8.log" 2>&1
ls -la "$H"/build/libhopper_base.so "$H"/build/libhopper_attention.so
