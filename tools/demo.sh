#!/bin/bash
# The main job: trains the built-in tiny Llama on a small byte-level corpus, standalone on the
# CPU backend, and leaves a Hugging Face checkpoint under runs/demo/checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN="${ITHACA_DEMO_DIR:-$PWD/runs/demo}"
mkdir -p "$RUN"
bazel build //worker:ithaca-worker //engine/train:ithaca-tokenize
bazel-bin/engine/train/ithaca-tokenize --input engine/train/testdata/tiny_corpus.txt \
  --output "$RUN/corpus.tok"
sed "s|@RUN@|$RUN|g" tools/demo_job.toml > "$RUN/job.toml"
echo "job spec: $RUN/job.toml"
bazel-bin/worker/ithaca-worker --standalone "$RUN/job.toml"
