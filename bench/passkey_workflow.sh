#!/bin/bash
# Does the long-context workflow learn? (docs/long_context.md, docs/benchmarks.md). A small Llama
# with the byte-level tokenizer is trained from scratch on the passkey retrieval task at S1 tokens
# (phase 1), scored by [eval.passkey] at S2 > S1 (before the extension), then extended: a new
# phase from phase 1's weights only ([init] from), at S2 with [model.rope] theta x THETA_MULT,
# scored again at S2 and S1 (after). Each phase is one `ithaca-worker --standalone` job.
#
#   bench/passkey_workflow.sh BIN OUT
#
# BIN holds ithaca-worker and passkey_corpus (//engine/data:passkey_corpus); OUT gets the specs,
# each job's log, and passkey.jsonl: one line per (phase, length) with accuracy and logprob per
# depth. The model's shape, the lengths and the steps come from the environment; the defaults are
# the H200 run of bench/results/2026-12-05-passkey-workflow.* (50.8M parameters, ~2.5 minutes).
# A CPU run needs a smaller model, e.g. BACKEND=cpu HIDDEN=128 LAYERS=4 HEADS=4 KV_HEADS=2
# HEAD_DIM=32 INTER=384 S1=256 S2=1024 PACK1=128 PACK2=256 (it learns more slowly).
set -euo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
BACKEND=${BACKEND:-cuda}
HIDDEN=${HIDDEN:-768} LAYERS=${LAYERS:-8} HEADS=${HEADS:-12} KV_HEADS=${KV_HEADS:-4}
HEAD_DIM=${HEAD_DIM:-64} INTER=${INTER:-2048}
THETA=${THETA:-10000} THETA_MULT=${THETA_MULT:-8}
S1=${S1:-4096} S2=${S2:-32768}
STEPS1=${STEPS1:-1500} STEPS2=${STEPS2:-300}
MB1=${MB1:-8} MB2=${MB2:-1}
# Each phase's windows hold 2^k shorter prompts (documents, data.document_mask) down to PACK1 /
# PACK2 tokens (passkey_corpus --pack_min); 0: one prompt a window.
PACK1=${PACK1:-256} PACK2=${PACK2:-4096}
LR=${LR:-1e-3} LR2=${LR2:-3e-4}
SAMPLES=${SAMPLES:-8}
DEPTHS=${DEPTHS:-"[0.0, 0.25, 0.5, 0.75, 1.0]"}
MEMORY=${MEMORY:-'recompute = "auto"'}  # the [memory] lines
mkdir -p "$OUT/model"
OUT=$(cd "$OUT" && pwd)

# Enough prompts that no window repeats: steps x micro_batch of each phase.
"$BIN/passkey_corpus" --out "$OUT/train-$S1.tok" --length "$S1" --count $((STEPS1 * MB1)) \
  --pack_min "$PACK1" --seed 1
"$BIN/passkey_corpus" --out "$OUT/train-$S2.tok" --length "$S2" --count $((STEPS2 * MB2)) \
  --pack_min "$PACK2" --seed 2

cat > "$OUT/model/config.json" <<EOF
{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": $HIDDEN,
  "intermediate_size": $INTER,
  "num_hidden_layers": $LAYERS,
  "num_attention_heads": $HEADS,
  "num_key_value_heads": $KV_HEADS,
  "head_dim": $HEAD_DIM,
  "vocab_size": 258,
  "bos_token_id": 256,
  "eos_token_id": 257,
  "rope_theta": $THETA,
  "rms_norm_eps": 1e-5,
  "max_position_embeddings": $S1,
  "tie_word_embeddings": false,
  "hidden_act": "silu",
  "torch_dtype": "float32"
}
EOF

# spec NAME SEQ_LEN STEPS MICRO_BATCH LR PASSKEY_LENGTHS EXTRA: one job file on stdout.
spec() {
  cat <<EOF
name = "$1"
backend = "$BACKEND"
[model]
config = "$OUT/model/config.json"
[data]
path = "$OUT/train-$2.tok"
seq_len = $2
micro_batch = $4
document_mask = true
[training]
steps = $3
lr = $5
min_lr_ratio = 0.1
warmup_steps = $(($3 / 20 + 1))
[eval]
every = 0
[eval.passkey]
lengths = $6
depths = $DEPTHS
samples = $SAMPLES
[memory]
$MEMORY
[metrics]
log_every = 25
$7
EOF
}

# run NAME SPEC: the job, its log, and its passkey lines into passkey.jsonl.
run() {
  echo "== $1 ($(date -u +%H:%M:%S))"
  printf '%s\n' "$2" > "$OUT/$1.toml"
  local t0=$SECONDS
  "$BIN/ithaca-worker" --standalone "$OUT/$1.toml" > "$OUT/$1.log" 2>&1 \
    || { tail -20 "$OUT/$1.log"; echo "$1 failed" >&2; exit 1; }
  grep -E "^step .*loss|passkey step" "$OUT/$1.log" | tail -6
  python3 - "$1" "$OUT/$1.log" "$((SECONDS - t0))" >> "$OUT/passkey.jsonl" <<'EOF'
import json, re, sys
phase, log, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
text = open(log).read()
losses = re.findall(r"^step (\d+)\b.*?\bloss ([0-9.]+)", text, re.M)
for m in re.finditer(r"passkey step (\d+), (\d+) tokens: accuracy ([0-9. ]+) at depths ([0-9. ]+),"
                     r" logprob ([-0-9. ]+), (\d+) samples", text):
    acc = [float(x) for x in m.group(3).split()]
    print(json.dumps({"phase": phase, "step": int(m.group(1)), "length": int(m.group(2)),
                      "depths": [float(x) for x in m.group(4).split()], "accuracy": acc,
                      "mean_accuracy": sum(acc) / len(acc),
                      "logprob": [float(x) for x in m.group(5).split()],
                      "samples": int(m.group(6)),
                      "last_loss": float(losses[-1][1]) if losses else None,
                      "job_seconds": seconds}))
EOF
}

run phase1 "$(spec phase1-s$S1 "$S1" "$STEPS1" "$MB1" "$LR" "[$S1]" "[checkpoint]
dir = \"$OUT/ckpt1\"
every = $STEPS1")"
# Before the extension: phase 1's model, its own RoPE, at S2 (an evaluation-only job).
run before "$(spec before-s$S2 "$S2" 0 1 "$LR" "[$S2]" "[checkpoint]
dir = \"$OUT/ckpt1\"
resume = true")"
run phase2 "$(spec phase2-s$S2 "$S2" "$STEPS2" "$MB2" "$LR2" "[$S1, $S2]" "[model.rope]
theta = $(python3 -c "print(float($THETA * $THETA_MULT))")
[init]
from = \"$OUT/ckpt1\"
[checkpoint]
dir = \"$OUT/ckpt2\"
every = $STEPS2")"
cat "$OUT/passkey.jsonl"
