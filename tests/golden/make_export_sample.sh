#!/bin/bash
# Makes an export for checking with transformers elsewhere (tests/golden/verify_export.py):
# trains the tiny model 3 steps on the CPU (with the BPE test tokenizer's files as its
# tokenizer), exports it as bf16 in several shards, and writes token ids and Ithaca's loss on
# them. Usage: tests/golden/make_export_sample.sh OUT_DIR (must not exist). Then, where
# transformers is installed:
#   python3 tests/golden/verify_export.py OUT_DIR/export OUT_DIR/ids.json \
#     --compare OUT_DIR/ithaca_loss.json [--dtype float32]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: make_export_sample.sh OUT_DIR}
[ ! -e "$OUT" ] || { echo "$OUT exists" >&2; exit 1; }
bazel build //tests/export:export_test_job //engine/checkpoint:ithaca-export \
  //engine/checkpoint:ithaca-model-loss
BIN=bazel-bin/engine/checkpoint
CORPUS=engine/data/testdata/tiny_corpus.txt
mkdir -p "$OUT"
bazel-bin/tests/export/export_test_job "$OUT/job" "$CORPUS" engine/data/testdata/bpe > "$OUT/job.log"
"$BIN/ithaca-export" "$OUT/job/checkpoints" --out "$OUT/export" --dtype bf16 \
  --source-model "$OUT/job/source_model" --max-shard-bytes 100000
# 200 bytes of the training text: byte-level token ids, as the tiny model was trained on.
python3 -c 'import json, sys; json.dump({"input_ids": list(open(sys.argv[1], "rb").read(200))},
  open(sys.argv[2], "w"))' "$CORPUS" "$OUT/ids.json"
"$BIN/ithaca-model-loss" "$OUT/export" "$OUT/ids.json" | tee "$OUT/ithaca_loss.json"
ls "$OUT/export"
