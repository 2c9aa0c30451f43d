#!/bin/bash
# Adds the CUDA runtime libraries of the pinned wheels (tools/requirements-cuda.txt, in .venv) that
# the GPU host lacks to a folder made by bench/collect_device_bin.sh, and packs that folder for
# the device in parts small enough to travel one call each:
#   bench/collect_device_bin.sh BIN_DIR
#   bench/collect_wheel_libs.sh BIN_DIR PARTS_DIR [MIB]
# BIN_DIR/cuda-lib then holds cuDNN 9.27 (the dispatcher, graph, runtime-compiled engines and
# heuristic libraries: enough for the graph API's SDPA nodes; the precompiled and tensor_ir engine
# libraries, 270 and 216 MB, are left out) and the wheel's cudart. PARTS_DIR/1, PARTS_DIR/2, ...
# each hold one piece of BIN_DIR as an xz-compressed tar (MIB each, default 56): carry one folder
# per call (`carry: [".device/wheels/1"]`), copy it to /tmp there, and once all have arrived
#   cat /tmp/parts/bin.tar.xz.* | xz -d | tar x -C /tmp     # gives /tmp/$(basename BIN_DIR)
# (files under /tmp survive between calls while the machine stays warm, 30 s) and run
# bench/device_session.sh on that folder: it puts cuda-lib first on LD_LIBRARY_PATH.
# xz -9 over two shared cores takes about 7 minutes.
# Left out on purpose: NCCL 2.32 (libnccl.so.2 is 344 MB) and cuBLAS 13.10 (cublasLt is 552 MB)
# are too large to carry; the host's own (CUDA 13.0's cuBLAS, its NCCL wheel) serve: the binaries
# call no cuBLAS or NCCL function newer than those (cuBLAS's symbols are unversioned, so a missing
# one fails at load), and the version check accepts an older NCCL down to kMinNcclVersion.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?bin dir (from bench/collect_device_bin.sh)}
PARTS=${2:?parts dir}
MIB=${3:-56}
NVIDIA=$(ls -d .venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1)
if [ -z "$NVIDIA" ]; then
  echo "no .venv/lib/python3*/site-packages/nvidia: run tools/setup.sh --cuda" >&2
  exit 1
fi
mkdir -p "$BIN/cuda-lib"
for lib in libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_runtime_compiled.so.9 \
  libcudnn_heuristic.so.9; do
  cp -f "$NVIDIA/cudnn/lib/$lib" "$BIN/cuda-lib/"
done
cp -f "$NVIDIA/cu13/lib/libcudart.so.13" "$BIN/cuda-lib/"

rm -rf "$PARTS"
mkdir -p "$PARTS/tmp"
tar cf - -C "$(dirname "$BIN")" "$(basename "$BIN")" | xz -T2 -9 \
  | split -b "${MIB}M" -d -a 1 - "$PARTS/tmp/bin.tar.xz."
n=0
for p in "$PARTS"/tmp/bin.tar.xz.*; do
  n=$((n + 1))
  mkdir -p "$PARTS/$n"
  mv "$p" "$PARTS/$n/"
done
rmdir "$PARTS/tmp"
echo "packed $BIN ($(du -sh "$BIN" | cut -f1)) into $n parts under $PARTS:"
du -sh "$PARTS"/*
