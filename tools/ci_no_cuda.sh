#!/bin/bash
# CI as on a fresh Debian 12 machine without CUDA: the build is forced to find no CUDA
# (ITHACA_CUDA=none, bazel/cuda_configure.bzl), so the CUDA backend, NCCL, the GPU tests and the
# benchmarks are left out and the CUDA factories are stubs; everything else (ithacad,
# ithaca-worker, the CLI, the demo, every CPU test) builds and runs. Its own Bazel output base
# keeps it from switching the default build's configuration back and forth. Ends with
# tools/test.sh's "N passed, N failed"; extra arguments go to `bazel test`.
set -o pipefail
cd "$(dirname "$0")/.."
export ITHACA_CUDA=none
export ITHACA_OUTPUT_BASE="${ITHACA_OUTPUT_BASE:-$HOME/.cache/ithaca/bazel-no-cuda}"
bash tools/setup.sh || { echo "0 passed, 1 failed"; exit 1; }
# //... would walk into the default build's bazel-* links (another output base's tree, with
# BUILD files in its runfiles): remove them (the next default build makes them again) and make
# none here.
find . -maxdepth 1 -type l -name 'bazel-*' -delete
bash tools/test.sh --symlink_prefix=/ "$@"
