#!/bin/bash
# PEFT and Ithaca on one LoRA adapter, both ways (peft_roundtrip.py): the adapters Ithaca trains
# (lora_trajectory, 5 steps) in peft.PeftModel.from_pretrained, and an adapter peft makes in
# ithaca-model-loss --lora, each giving the same loss in both.
set -euo pipefail
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
traj="$1"
model_loss="$2"
script="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
"$traj" --out "$tmp/run" --steps 5
"$PY" "$script" "$model_loss" "$tmp/run"
