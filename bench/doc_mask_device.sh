#!/bin/bash
# The device call of the document-mask work (packed samples: ops.h's DocumentMask), from the
# repository root: `bench/doc_mask_device.sh BIN_DIR OUT_DIR PHASE...`, BIN_DIR as
# bench/collect_device_bin.sh makes it. Phases:
#   tests        attention_test and cuda_ops_test (the document cases against the CPU oracle)
#                and the other CUDA backend tests (the unmasked paths unchanged),
#                logged to OUT_DIR/doc-mask-gpu-tests.log
#   bench:S:N    attention_bench at hd 64, 32 query and 8 KV heads (Llama-3.2-1B), S tokens:
#                full causal and documents of N tokens side by side, into OUT_DIR/doc-mask.jsonl
#                (cuDNN's plan choices in OUT_DIR/doc-mask-bench.log)
set -uo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
shift 2
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
for phase in "$@"; do
  echo "=== phase $phase ($(date +%T))"
  IFS=: read -r name a1 a2 a3 <<<"$phase"
  case "$name" in
    tests)
      log="$OUT/doc-mask-gpu-tests.log"
      {
        echo "# GPU tests of the document mask, bench/doc_mask_device.sh tests"
        echo "date: $(date -u '+%F %T UTC')"
        echo "commit: $(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)"
        echo "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
      } | tee "$log"
      for t in attention_test cuda_ops_test rmsnorm_test cuda_allocator_test cuda_train_test \
        copy_stream_test; do
        start=$(date +%s)
        if timeout 150 "$BIN/$t" >"$OUT/t_$t.txt" 2>&1; then status=PASSED; else status=FAILED; fi
        {
          echo "$status: $t ($(($(date +%s) - start)) s)"
          grep -E -e "^\[  (FAILED|PASSED|SKIPPED) |^\[ +OK|rel_l2|ran:|Failure|rror|Expected|Which is" \
            "$OUT/t_$t.txt" | head -150 | sed 's/^/  /'
        } | tee -a "$log"
      done
      ;;
    bench)
      ITHACA_CUDNN_VERBOSE=1 timeout "${a3:-240}" "$BIN/attention_bench" \
        --shapes="64:32:8:$a1" --doc_len="$a2" --iters=3 --passes=fwd,bwd \
        2>>"$OUT/doc-mask-bench.log" | tee -a "$OUT/doc-mask.jsonl"
      grep -E "chose|cannot|failed|unavailable" "$OUT/doc-mask-bench.log" | tail -8
      ;;
  esac
done
