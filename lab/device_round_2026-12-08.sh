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
#   check    issue 51's ring pieces on cuDNN (attention_test Chunks/*), the GPU suite, and
#            issue 50's s8 (lab/hopper_attention/run_device.sh hd64p; carry
#            lab/hopper_attention/build from build_s8.sh), about 4 min
# Start and collect must follow each other within the machine's 30 s warm time.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:?calib, check, full, fullcollect, start, collect or lora}" in
  calib) lab/calibrate_long_attention.sh ;;
  check)
    [ -x .device/bin/attention_test ] ||
      python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
    export LD_LIBRARY_PATH=$PWD/.device/bin/lib
    nvidia-smi -L
    timeout 120 .device/bin/attention_test --gtest_filter='Chunks/*' > "$OUT/ring-chunks.log" 2>&1
    echo "ring chunks rc=$?"; grep -E "PASSED|FAILED|tests ran" "$OUT/ring-chunks.log" | tail -4
    bench/device_session.sh .device/bin "$OUT" tests 2>&1 | tail -4
    lab/hopper_attention/run_device.sh hd64p ;;
  start | collect) lab/device_round_2026-12-07d.sh "$1" ;;
  full)  # full fine-tuning's 512K step on whichever GPU this is (issue 52 on an H100, 56 on an H200),
         # started in the background and waited for until WAIT_S; `collect` goes on waiting
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    export GPU_GIB=80 BG_NAME=full512k BG_EXTRA=--lora_rank=0 HOST_GIB=${HOST_GIB:-125}
    [ "$mib" -gt 100000 ] && export GPU_GIB=140 RATES=$PWD/engine/plan/rates/h200.txt
    lab/device_round_2026-12-07c.sh bg512k
    WAIT_S=${WAIT_S:-520} lab/device_round_2026-12-07c.sh wait512k ;;
  fullcollect)
    export BG_NAME=full512k HOST_GIB=${HOST_GIB:-125}
    WAIT_S=${WAIT_S:-580} lab/device_round_2026-12-07c.sh wait512k ;;
  lora)
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    if [ "$mib" -gt 100000 ]; then
      export GPU_GIB=140 RATES=$PWD/engine/plan/rates/h200.txt
    fi
    HOST_GIB=${HOST_GIB:-125} lab/device_round_2026-12-07c.sh s128k ;;
esac
