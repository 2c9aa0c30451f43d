#!/bin/bash
# The device calls of 2026-12-05: `lab/device_round_2026-12-05.sh PART...`, PART one of
#   workflow   the long-context workflow's learning run (issue 41), bench/passkey_workflow.sh
#   eval512k   the passkey eval's cost at 512K next to a training step (issue 41), alone
#   tests      the GPU suite (issue 44)
# Results under $OUT (at most 8 files come back: the workflow's are one tarball).
set -uo pipefail
[ -x .device/bin/ithaca-worker ] ||
  python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
nvidia-smi -L
BIN=$PWD/.device/bin
export LD_LIBRARY_PATH=$BIN/lib NCCL_NVLS_ENABLE=0
for part in "$@"; do
  echo "=== $part ($(date -u +%T))"
  case "$part" in
    workflow)
      MEMORY='recompute = "auto"' STEPS1=${STEPS1:-1500} MB1=8 PACK1=256 STEPS2=${STEPS2:-300} \
        PACK2=4096 SAMPLES=8 timeout "${WORKFLOW_TIMEOUT:-330}" \
        bash bench/passkey_workflow.sh "$BIN" /tmp/pkw 2>&1 | tail -14
      grep -E "^step" /tmp/pkw/phase1.log | sed -n '1p;$p' | cut -c1-120
      (cd /tmp && tar czf "$OUT/passkey-workflow.tgz" --exclude='*.tok' --exclude='ckpt*' pkw)
      ;;
    eval512k)
      TRAIN_TIMEOUT=${TRAIN_TIMEOUT:-200} bash bench/device_session.sh "$BIN" "$OUT" \
        "train:524288:--warmup=0+--steps=1+--passkey_samples=1+--passkey_depths=0.5+--tag=passkey-512k" \
        > "$OUT/train.out" 2>&1
      grep -o '"mode": "[a-z]*"\|"step_s": [0-9.]*\|"s_per_prompt": [0-9.]*\|"prompt_vs_train_step": [0-9.]*' "$OUT/train.jsonl" | head
      tail -3 "$OUT/train.out"
      ;;
    tests)
      bash bench/device_session.sh "$BIN" "$OUT" tests > "$OUT/tests.out" 2>&1
      grep -E "^(PASSED|FAILED)" "$OUT/tests.out"; tail -2 "$OUT/tests.out"
      ;;
  esac
done
