#!/bin/bash
# The forward's lazy rescale (ITHACA_FWD_RESCALE_LOG2=8, "ours") against the same kernel with the
# classic online softmax (HEAD, "base"), in one process on the GPU machine; carry
# lab/hopper_attention/build (both libraries built here: build.sh -DITHACA_FWD_RESCALE_LOG2=8, and
# LIB_OUT=.../libhopper_base.so from `git archive HEAD`).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
H=lab/hopper_attention
export HOPPER_ATTN_BASE_LIB=$H/build/libhopper_base.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
{ timeout 150 python3 $H/bench.py check --check-impls ours,base
  timeout 90 python3 $H/bench.py check --quick --heads 4:1 --check-impls ours; } 2>&1 |
  grep -v Warn > "$OUT/check.jsonl"
echo "checks ok: $(grep -c '"ok": true' "$OUT/check.jsonl") of $(grep -c '"check"' "$OUT/check.jsonl")"
grep '"ok": false' "$OUT/check.jsonl" | cut -c1-300
MIN_REPS=3 timeout 200 python3 $H/bench.py bench --S 16384,131072 --D 128,64 \
  --impls base,ours,base,ours --out "$OUT/bench.jsonl" 2>&1 | grep -v Warn | cut -c1-130
MIN_REPS=2 timeout 120 python3 $H/bench.py bench --S 1048576 --D 128 --heads 4:1 \
  --impls base,ours,base,ours --out "$OUT/bench.jsonl" 2>&1 | grep -v Warn | cut -c1-130
# The engine built with the lazy rescale on (.device/bin.tar.xz, when carried): its GPU tests.
if [ -f .device/bin.tar.xz ]; then
  python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
  export LD_LIBRARY_PATH=$PWD/.device/bin/lib
  for t in cuda_ops_test attention_test hopper_attention_test cuda_train_test; do
    timeout 150 .device/bin/$t > "$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
    grep -E "^\[  FAILED  \]" "$OUT/$t.log" | head -5
  done
fi
