#!/bin/bash
# The device calls that issues 51, 52 and 56 still need; each part a call of its own (or parts
# chained in one command), results under $OUT, .device/bin.tar.xz carried (the README's device
# binaries; for `ring`, built with lab/ring_rectangle/2026-12-07.patch applied):
#   ring         issue 51: the whole attention_test (the ring pieces' rectangle on cuDNN, about
#                40 s), then the GPU suite (about 3 min); any GPU
#   calib        attention rates past 128K on this GPU (lab/calibrate_long_attention.sh, ~3 min):
#                on an H200, merge the rows into engine/plan/rates/h200.txt as 2026-12-07's went
#                into h100.txt (issue 56's prediction)
#   full         full fine-tuning's whole 512K step of Llama-3-8B with auto's plan for this GPU
#                and a 125 GiB host (H100: ran 2026-12-07, 707.8 s; H200: predicted 603 s),
#                started in the background, waited for up to WAIT_S (520)
#   fullcollect  waits for it (WAIT_S, 580) and collects it; again if it is still running. The
#                machine must stay warm: each call within 30 s of the last
#   lora         LoRA rank 16 and full fine-tuning whole steps at 128K (issue 52; with the H200's
#                140 GiB and rates on an H200)
#   start, collect  the older pair (device_round_2026-12-07d.sh: LoRA's 512K step on an H100)
# Ran on 2026-12-07 (sixth session, one H100): the ring chunks as first written (a fix followed,
# lab/ring_rectangle/README.md), the GPU suite, s8 (rejected) and `full`. On 2026-12-07 (seventh
# session, one H100): `ring` with the fix (passed; landed). Still to run: calib, full, fullcollect
# and lora on an H200, which none of the last three sessions could get.
set -uo pipefail
cd "$(dirname "$0")/.."
# An H200 (over 100,000 MiB of GPU memory) takes the 140 GiB budget and the H200's rate table.
on_h200() {
  [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 100000 ]
}
case "${1:?ring, calib, full, fullcollect, lora, start or collect}" in
  calib) lab/calibrate_long_attention.sh ;;
  ring)
    [ -x .device/bin/attention_test ] ||
      python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
    export LD_LIBRARY_PATH=$PWD/.device/bin/lib
    nvidia-smi -L
    timeout 150 .device/bin/attention_test > "$OUT/attention-test-ring.log" 2>&1
    echo "attention_test rc=$?"
    grep -E "off-diagonal|cuDNN has no|^\[  (PASSED|FAILED)" "$OUT/attention-test-ring.log" | cut -c1-200
    bench/device_session.sh .device/bin "$OUT" tests 2>&1 | tail -4 ;;
  start | collect) lab/device_round_2026-12-07d.sh "$1" ;;
  full)  # full fine-tuning's 512K step on whichever GPU this is (issue 52 on an H100, 56 on an H200),
         # started in the background and waited for until WAIT_S; `fullcollect` goes on waiting
    export GPU_GIB=80 BG_NAME=full512k BG_EXTRA=--lora_rank=0 HOST_GIB=${HOST_GIB:-125}
    on_h200 && export GPU_GIB=140 RATES=$PWD/engine/plan/rates/h200.txt
    lab/device_round_2026-12-07c.sh bg512k
    WAIT_S=${WAIT_S:-520} lab/device_round_2026-12-07c.sh wait512k ;;
  fullcollect)
    export BG_NAME=full512k HOST_GIB=${HOST_GIB:-125}
    WAIT_S=${WAIT_S:-580} lab/device_round_2026-12-07c.sh wait512k ;;
  lora)
    on_h200 && export GPU_GIB=140 RATES=$PWD/engine/plan/rates/h200.txt
    HOST_GIB=${HOST_GIB:-125} lab/device_round_2026-12-07c.sh s128k ;;
esac
