#!/bin/bash
# Ithaca's CPU loss and gradients against an independent PyTorch Llama (and Qwen2, Qwen3, Mistral),
# for a tiny model with GQA
# and llama3 rope_scaling, tied and untied embeddings, every recompute policy, headwise chunks.
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
run tied_full --recompute full --seq 37 --tile 8
run untied_none --untied --recompute none --seq 29 --tile 64
# Headwise chunking (one query head per stage) with attention-aware recompute and offload.
run chunked_aware --recompute attention-aware --offload --head-chunk 1 --seq 33 --tile 16
# A packed sample: documents of 1, 9, 14 and 11 tokens (RoPE positions and attention per document).
run packed_chunked --recompute full --head-chunk 2 --seq 35 --tile 8 --docs 0,1,10,24
# The other families and RoPE types. Qwen2: q/k/v biases, tied; Qwen3: q/k norms with head_dim 24
# (not hidden / heads), untied, headwise chunks; Mistral: a 5-key sliding window (with packed
# documents too, and windows of 1 and wider than the sample); linear and yarn RoPE.
run qwen2_tied --family qwen2 --recompute full --seq 31 --tile 8
run qwen3_untied_chunked --family qwen3 --untied --recompute attention-aware --head-chunk 1 --seq 29 --tile 16
run qwen3_yarn --family qwen3 --rope yarn --recompute none --seq 33 --tile 64
run mistral_window --family mistral --window 5 --recompute full --seq 37 --tile 8
run mistral_window_packed --family mistral --window 4 --recompute full --head-chunk 2 --seq 35 --tile 8 --docs 0,1,10,24
run mistral_window_1 --family mistral --window 1 --recompute none --seq 19 --tile 8
run mistral_window_wide --family mistral --window 100 --recompute none --seq 19 --tile 8
run llama_linear --rope linear --recompute full --seq 37 --tile 8
run llama_yarn --rope yarn --untied --recompute full --seq 37 --tile 8
# Qwen2/Qwen3's use_sliding_window: the window on the layers from max_window_layers on (layer 1
# of 2; with packed documents too), every other layer full causal.
run qwen2_window_layers --family qwen2 --window 4 --window-from 1 --recompute full --seq 31 --tile 8
run qwen3_window_layers_packed --family qwen3 --window 3 --window-from 1 --recompute attention-aware --head-chunk 1 --seq 35 --tile 8 --docs 0,1,10,24
run qwen2_yarn_offload --family qwen2 --rope yarn --recompute attention-aware --offload --seq 27 --tile 8
# The mix auto plans for long steps: block 1 keeps O and LSE and its data on the device, block 0
# recomputes fully and offloads its input (memory.attention_aware_blocks, offload_keep_last).
run aware_mix_split_offload --recompute attention-aware --aware-blocks 1 --offload --offload-keep-last 1 --head-chunk 1 --seq 33 --tile 16
