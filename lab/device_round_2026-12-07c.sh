#!/bin/bash
# The device calls of the 2026-12-07 (third) session, issue 52's measurements: Llama-3-8B with
# LoRA (rank 16, alpha 32, all seven targets) on one GPU next to full fine-tuning, auto's plan for
# this GPU (80 GB on an H100) and this machine's host.
#   `lab/device_round_2026-12-07c.sh PART...` with .device/bin.tar.xz carried; results under $OUT.
#   s128k       whole steps at 131,072 tokens (one warm-up, one timed), LoRA and full
#   bg512k      starts the whole LoRA step at 524,288 tokens (bench/device_background.sh, no
#               warm-up: ~11 minutes) under /tmp/ithaca-bg/$BG_NAME; BG_NAME=full512k
#               BG_EXTRA=--lora_rank=0 runs full fine-tuning's instead (issue 56's H100 step)
#   wait512k    waits for it (up to WAIT_S), then collects it into $OUT
#   probe       the memory probe of LoRA at PROBE_S (attention windowed to 4096; the rest of the
#               step as auto plans it)
# RATES (default the committed H100 table) for the predictions. wait512k takes BG_NAME too.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
[ -x .device/bin/parallel_bench ] ||
  python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
BIN=$PWD/.device/bin
export LD_LIBRARY_PATH=$BIN/lib
RATES=${RATES:-$PWD/engine/plan/rates/h100.txt}
HOST_GIB=${HOST_GIB:-$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)}
GPU_GIB=${GPU_GIB:-80}
# What auto may choose for memory.recompute: "auto" (the default); the first calls of this round
# ran the bench's own default, "full", before the flag was passed (RECOMPUTE=full repeats them).
RECOMPUTE=${RECOMPUTE:-auto}
LORA="--lora_rank=16 --lora_alpha=32"
BG_NAME=${BG_NAME:-lora512k}
BG_EXTRA=${BG_EXTRA:-$LORA}
step() {  # S WARMUP LOG EXTRA...: rank 0 of world 1 with auto's plan for this node
  local s=$1 warmup=$2 log=$3
  shift 3
  "$BIN/parallel_bench" --backend=cuda --rehearse --world=1 --sp=1 --model=llama-3-8b \
    --seq_lens=$s --planner_settings --device_memory_gib=$GPU_GIB --node_host_gib=$HOST_GIB \
    --warmup=$warmup --steps=1 --compute_step=false --rates=$RATES --recompute=$RECOMPUTE "$@" \
    2>>"$log"
}
summary='import json,sys
for l in sys.stdin:
  d=json.loads(l); t=d["techniques"]
  print(d["model"], "S", d["S"], "lora", t.get("lora_rank"), "mode", d["mode"], "step_s", d.get("step_s"),
        "tok/s", d.get("projected_tok_per_s_per_gpu"), "pred", d.get("predicted_step_s"),
        "peak", d.get("device_peak_bytes"), "planner", (d.get("planner") or {}).get("device_total_bytes"),
        "attn", t.get("attention"))'
for part in "$@"; do
  echo "=== $part ($(date -u +%T), host $HOST_GIB GiB)"
  case "$part" in
    s128k)
      for extra in "$LORA" "--lora_rank=0"; do
        timeout 280 bash -c "$(declare -f step); BIN=$BIN GPU_GIB=$GPU_GIB HOST_GIB=$HOST_GIB RATES=$RATES RECOMPUTE=$RECOMPUTE step 131072 1 $OUT/s128k.log $extra" |
          tee -a "$OUT/s128k.jsonl" | python3 -c "$summary"
        echo "  rc=${PIPESTATUS[0]}"
      done
      grep -E "memory plan|start-up|step [0-9]" "$OUT/s128k.log" | cut -c1-400 ;;
    bg512k)
      B=/tmp/ithaca-bg/$BG_NAME
      mkdir -p $B
      bash bench/device_background.sh start $BG_NAME bash -c \
        "$(declare -f step); BIN=$BIN GPU_GIB=$GPU_GIB HOST_GIB=$HOST_GIB RATES=$RATES RECOMPUTE=$RECOMPUTE step 524288 0 $B/stderr.log $BG_EXTRA > $B/line.jsonl" ;;
    wait512k)
      bash bench/device_background.sh wait $BG_NAME "${WAIT_S:-500}"
      rc=$?
      cat /tmp/ithaca-bg/$BG_NAME/line.jsonl 2>/dev/null | python3 -c "$summary"
      grep -E "memory plan|start-up|step [0-9]" /tmp/ithaca-bg/$BG_NAME/stderr.log | cut -c1-400
      bash bench/device_background.sh collect $BG_NAME "$OUT"
      echo "wait rc=$rc" ;;
    probe)
      timeout ${PROBE_TIMEOUT:-500} bash -c "$(declare -f step); BIN=$BIN GPU_GIB=$GPU_GIB HOST_GIB=$HOST_GIB RATES=$RATES RECOMPUTE=$RECOMPUTE step ${PROBE_S:-1048576} 0 $OUT/probe.log $LORA --probe=4096" |
        tee -a "$OUT/probe.jsonl" | python3 -c "$summary"
      echo "  rc=${PIPESTATUS[0]}"
      grep -E "memory plan|start-up|step [0-9]|probe" "$OUT/probe.log" | cut -c1-400 ;;
  esac
done
