#!/bin/bash
# Gathers prebuilt GPU test and bench binaries into one folder for the GPU host, with the
# shared libraries they need that such a host lacks (Debian's Abseil, gflags, ...; not CUDA,
# cuDNN, NCCL or glibc, which the host has): `bench/collect_device_bin.sh OUT_DIR`, after
#   bazel build //engine/backend/cuda:all //engine/comm/nccl:all //tests/gpu:all //bench/... //server:ithacad \
#     //worker:ithaca-worker //client:ithaca //engine/checkpoint:ithaca-model-loss
# Then carry OUT_DIR to the device and run `bench/device_session.sh OUT_DIR RESULTS PHASE...`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?out dir}
mkdir -p "$OUT/lib"
bins=$(find bazel-bin/engine/backend/cuda bazel-bin/engine/comm/nccl bazel-bin/tests/gpu bazel-bin/bench \
  -maxdepth 2 -type f -perm -u+x ! -name '*.so' ! -name '*.a' ! -name '*.params' ! -name '*.sh' ! -name '*.runfiles_manifest' \
  ! -path '*runfiles*' ! -path '*_objs*' 2>/dev/null)
# The service too (the daemon phase): ithacad, its worker and the CLI (the tokenizer is
# tools/tokenize/ithaca-tokenize, run from the tree).
# ithaca-model-loss scores the daemon phase's export against transformers.
bins="$bins bazel-bin/server/ithacad bazel-bin/worker/ithaca-worker bazel-bin/client/ithaca"
bins="$bins bazel-bin/engine/checkpoint/ithaca-model-loss"
for b in $bins; do
  cp -f "$b" "$OUT/"
  { ldd "$b" || true; } | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) ;;
      libcuda*|libcudnn*|libnccl*|libcublas*|libnvrtc*|libnvJitLink*) ;;
      *) cp -fL "$lib" "$OUT/lib/" ;;
    esac
  done
done
git rev-parse HEAD > "$OUT/COMMIT" 2>/dev/null || true  # the GPU host has no .git
echo "collected $(ls "$OUT" | grep -vc '^lib$') binaries and $(ls "$OUT/lib" | wc -l) libraries" \
  "($(du -sh "$OUT" | cut -f1)) in $OUT"
