#!/bin/bash
# Ithaca's LoRA training on the CPU against an independent PyTorch LoRA (lora_reference.py): 20
# AdamW steps of a tiny Llama's adapters on all seven targets from one PEFT adapter, the losses,
# gradient norms and final adapters compared, the base's weights unchanged to the bit (checked by
# lora_trajectory itself). Under full recompute with one head per UPipe stage and 8-token tiles,
# and with no recompute and whole tiles.
set -euo pipefail
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
traj="$1"
ref="$2"
llama_ref="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
run() {
  local name="$1"; shift
  echo "== $name"
  "$traj" --out "$tmp/$name" "$@"
  "$PY" "$ref" "$llama_ref" "$tmp/$name"
}
run full_chunked --recompute full --head-chunk 1 --tile 8 --seq 33
run none_whole --recompute none --tile 64 --seq 29
