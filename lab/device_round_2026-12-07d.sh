#!/bin/bash
# The device calls of the 2026-12-07 (fifth) session: issue 56's whole step of Llama-3-8B at
# 524,288 tokens with auto's plan (full fine-tuning on an H200, whose lent host the plan fills
# with the optimizer state; LoRA rank 16 on an H100, where full fine-tuning would outrun the
# session), then the GPU suite (issue 55: the moves and the inline Shape re-run on a GPU).
#   call 1: lab/device_round_2026-12-07d.sh start    starts the step, waits up to WAIT_S (520)
#   call 2: lab/device_round_2026-12-07d.sh finish   waits for it, collects it, runs the suite
#           (`collect` instead: waits and collects only)
# Ran on an H100 on 2026-12-07 (the H200 did not start): bench/results/2026-12-07-lora-512k-*.
# The host is taken as 125 GiB (the lent machines' 128 GiB less the system's share): an H200
# machine's MemTotal starts low and grows as memory is used.
set -uo pipefail
cd "$(dirname "$0")/.."
export HOST_GIB=${HOST_GIB:-125}
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$mib" -gt 100000 ]; then
  export GPU_GIB=140 BG_NAME=full512k BG_EXTRA=--lora_rank=0 RATES=$PWD/engine/plan/rates/h200.txt
else
  export GPU_GIB=80 BG_NAME=lora512k
fi
nvidia-smi -L
case "${1:?start or finish}" in
  start)
    lab/device_round_2026-12-07c.sh bg512k
    WAIT_S=${WAIT_S:-520} lab/device_round_2026-12-07c.sh wait512k ;;
  finish | collect)
    WAIT_S=${WAIT_S:-400} lab/device_round_2026-12-07c.sh wait512k
    [ "$1" = finish ] && bench/device_session.sh .device/bin "$OUT" tests ;;
esac
