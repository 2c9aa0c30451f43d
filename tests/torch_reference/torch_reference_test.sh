#!/bin/bash
# Ithaca's CPU loss and gradients against an independent PyTorch Llama, for a tiny model with GQA
# and llama3 rope_scaling, tied and untied embeddings, every checkpoint policy, headwise chunks.
set -euo pipefail
# The project's .venv (tools/setup.sh), found through this script's link back into the source
# tree (Bazel's runfiles are links); ITHACA_PYTHON overrides it.
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
dump="$1"
ref="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
run() {
  local name="$1"; shift
  echo "== $name"
  "$dump" --out "$tmp/$name" "$@"
  "$PY" "$ref" "$tmp/$name"
}
run tied_full --checkpoint full --seq 37 --tile 8
run untied_none --untied --checkpoint none --seq 29 --tile 64
# Headwise chunking (one query head per stage) with attention-aware checkpointing and offload.
run chunked_aware --checkpoint attention-aware --offload --head-chunk 1 --seq 33 --tile 16
# A packed sample: documents of 1, 9, 14 and 11 tokens (RoPE positions and attention per document).
run packed_chunked --checkpoint full --head-chunk 2 --seq 35 --tile 8 --docs 0,1,10,24
