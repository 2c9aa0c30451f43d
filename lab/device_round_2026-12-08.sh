#!/bin/bash
# The next device session's calls (issues 52 and 56 on an H200; pass needs_h200 to `run`), each
# part a call of its own, in this order (about 24 of the session's 30 device minutes):
#   calib    attention rates past 128K on this GPU (lab/calibrate_long_attention.sh, ~3 min):
#            merge the rows into engine/plan/rates/h200.txt as 2026-12-07's went into h100.txt
#   start    full fine-tuning's whole step of Llama-3-8B at 524,288 tokens with auto's plan
#            (predicted 603 s on a 125 GiB host), waits up to 520 s (device_round_2026-12-07d.sh)
#   collect  waits for it (up to 400 s) and collects it into $OUT
#   lora     LoRA rank 16 and full fine-tuning whole steps at 128K (one warm-up, one timed each;
#            device_round_2026-12-07c.sh s128k with the H200's 140 GiB and rates)
# On an H100 the same parts run LoRA's 512K step instead (device_round_2026-12-07d.sh decides).
# Start and collect must follow each other within the machine's 30 s warm time.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:?calib, start, collect or lora}" in
  calib) lab/calibrate_long_attention.sh ;;
  start | collect) lab/device_round_2026-12-07d.sh "$1" ;;
  lora)
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    if [ "$mib" -gt 100000 ]; then
      export GPU_GIB=140 RATES=$PWD/engine/plan/rates/h200.txt
    fi
    HOST_GIB=${HOST_GIB:-125} lab/device_round_2026-12-07c.sh s128k ;;
esac
