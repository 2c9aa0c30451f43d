#!/bin/bash
# Runs the CUDA backend's GPU tests and the benchmarks on a GPU host, from prebuilt binaries:
# `bench/gpu_suite.sh BIN_DIR OUT_DIR [train S list]`. BIN_DIR holds the test and bench binaries
# (built here with `bazel build --dynamic_mode=off //engine/backend/cuda:all //bench/...`) and a
# lib/ folder with the non-CUDA shared libraries they need (Abseil, libgomp) where the host lacks
# them. Run from the repository root (the training test reads engine/train/testdata). Each
# benchmark's JSON lines go to OUT_DIR/<name>.jsonl, the logs to OUT_DIR/*.log.
set -uo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
TRAIN_S=${3:-65536,131072}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.log"
missing=$(ldd "$BIN/cuda_ops_test" | grep "not found")
[ -n "$missing" ] && echo "missing libraries: $missing"

pass=0
fail=0
for t in rmsnorm_test cuda_allocator_test cuda_ops_test attention_test cuda_train_test \
  nccl_comm_test; do
  if timeout 240 "$BIN/$t" 2>&1 | tee -a "$OUT/tests.log"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAILED: $t" | tee -a "$OUT/tests.log"
  fi
done
echo "tests: $pass passed, $fail failed" | tee -a "$OUT/tests.log"

timeout 120 "$BIN/gemm_bench" 2>>"$OUT/bench.log" | tee "$OUT/gemm.jsonl"
timeout 180 "$BIN/attention_bench" 2>>"$OUT/bench.log" | tee "$OUT/attention.jsonl"
# The own flash kernel (FFMA fallback) at a length it finishes quickly.
timeout 120 "$BIN/attention_bench" --impl=own --shapes=128:32:8:8192,64:32:8:8192 --iters=2 \
  2>>"$OUT/bench.log" | tee "$OUT/attention_own.jsonl"
timeout "${TRAIN_TIMEOUT:-300}" "$BIN/train_bench" --seq_lens="$TRAIN_S" \
  2> >(tee -a "$OUT/bench.log" >&2) | tee "$OUT/train.jsonl"
