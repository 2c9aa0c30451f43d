#!/bin/bash
# Attention rates past the rate table's longest length (131,072), on the device, for the step-time
# model at 512K and beyond: `lab/calibrate_long_attention.sh` with .device/bin.tar.xz carried;
# each run's table and log under $OUT. Only the `attention` rows of these tables are new; the
# GEMM and elementwise rows are a minimal set the tool measures regardless.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH
[ -x .device/bin/calibrate ] ||
  python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
export LD_LIBRARY_PATH=$PWD/.device/bin/lib
nvidia-smi -L
case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
  *H100*) DEVICE=h100 ;;
  *) DEVICE=h200 ;;
esac
run() {  # NAME HEAD_DIMS HEADS SEQS
  echo "=== $1 ($(date -u +%T))"
  timeout 300 .device/bin/calibrate --backend=cuda --device=$DEVICE --models=llama-3.2-1b \
    --layouts=1:1 --seq_lens=4096 --elementwise_elems=4096 --adamw_params=4096 \
    --head_dims=$2 --attention_heads=$3 --attention_seqs=$4 > "$OUT/$1.txt" 2> "$OUT/$1.log"
  echo "rc=$?"; grep "^attention" "$OUT/$1.log"
}
run h4 128,64 4 262144,524288,1048576
run h32 128,64 32 262144,524288
run h4_2m 128 4 2097152
