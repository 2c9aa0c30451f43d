#!/bin/bash
# The step-time model on one GPU: calibrate its rate table, then time steps with the lines'
# predicted_step_s beside the measured step_s (engine/plan/step_time.h, docs/schedules.md).
#
#   bench/step_time_session.sh BIN OUT PHASE...
#
# BIN holds calibrate and parallel_bench (bench/collect_device_bin.sh); OUT gets DEVICE.txt (the
# table; DEVICE=h200 by default, h100 on an H100), calibrate.log, steps.jsonl / steps.log.
# Rehearsals cap the GPU at DEVICE_GIB (140 on an H200, 80 on an H100). Phases:
#   calibrate                      measure the table into OUT/DEVICE.txt
#   step:MODEL:S:FLAGS             one warm-up and one timed step at world 1 (FLAGS: + for spaces)
#   rehearse:MODEL:WORLD:S:FLAGS   rank 0 of WORLD (sp = WORLD) rehearsed, the planner's settings
# Steps predict with OUT/DEVICE.txt when it exists (RATES= overrides), else the committed table.
set -uo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
shift 2
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
DEVICE=${DEVICE:-h200}
case "$DEVICE" in h100) DEVICE_GIB=${DEVICE_GIB:-80} ;; *) DEVICE_GIB=${DEVICE_GIB:-140} ;; esac
rates() { local r=${RATES:-$OUT/$DEVICE.txt}; [ -f "$r" ] && echo "--rates=$r"; }
for phase in "$@"; do
  IFS=: read -r name a1 a2 a3 a4 <<< "$phase"
  echo "== $phase ($(date -u +%H:%M:%S))" | tee -a "$OUT/steps.log" >&2
  case "$name" in
    calibrate)
      "$BIN/calibrate" --backend=cuda --device="$DEVICE" --min_seconds="${MIN_SECONDS:-0.02}" \
        > "$OUT/$DEVICE.txt.tmp" 2> >(tee -a "$OUT/calibrate.log" >&2) &&
        mv "$OUT/$DEVICE.txt.tmp" "$OUT/$DEVICE.txt"
      ;;
    step)
      timeout "${STEP_TIMEOUT:-560}" "$BIN/parallel_bench" --backend=cuda --world=1 --sp=1 \
        --model="$a1" --seq_lens="$a2" --warmup="${WARMUP:-1}" --steps=1 $(rates) ${a3//+/ } \
        2> >(tee -a "$OUT/steps.log" >&2) | tee -a "$OUT/steps.jsonl"
      ;;
    rehearse)
      timeout "${STEP_TIMEOUT:-560}" "$BIN/parallel_bench" --backend=cuda --rehearse \
        --world="$a2" --sp="$a2" --model="$a1" --seq_lens="$a3" --planner_settings \
        --device_memory_gib="$DEVICE_GIB" --node_host_gib="${NODE_HOST_GIB:-2048}" --warmup="${WARMUP:-1}" --steps=1 \
        --compute_step=false $(rates) ${a4//+/ } \
        2> >(tee -a "$OUT/steps.log" >&2) | tee -a "$OUT/steps.jsonl"
      ;;
    *) echo "unknown phase $phase" >&2 ;;
  esac
done
