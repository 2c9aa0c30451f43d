#!/bin/bash
# The device calls of 2026-12-07 (issue 50), on an H100: `lab/device_round_2026-12-07.sh PART...`
#   bwdspills  where the backward's spills are (consumer or producer code), per built library
#   bwdcheck   the backward in pairs against an fp32 PyTorch reference: the default rule and
#              every tile paired (allpairs), at the small shapes and at 16,448 tokens (32:8), where
#              the default rule pairs the tiles of all rounds but the last
#   bwdbench   the backward in pairs (ours) against the kernel before it (base: HEAD before this
#              session's change, built from git archive), the same build without pairs (nopairs) and
#              every tile paired (allpairs), in one process: 32:8 at 16K and 128K (hd128, hd64),
#              4:1 at 1M (what a rank of Llama-3-8B runs under Ulysses 8); BWD_SETS: other
#              bench_bwd.py argument sets, ';'-separated
#   failtests  the engine's HopperRunTimeFailure tests (run-time failures are errors, not aborts)
#   loratest   the engine's LoRA GPU check (cuda_train_test: CUDA LoRA tracks the CPU losses)
#   anything else: a part of lab/device_round_2026-12-06.sh (tests, calibrate, attn, ...)
# Libraries: lab/hopper_attention/build (forward) and lab/hopper_attention/backward/build (carried).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
B=lab/hopper_attention/backward
for part in "$@"; do
  echo "=== $part ($(date -u +%T))"
  case "$part" in
    bwdspills) python3 $B/sass_spills.py 2>&1 | tee "$OUT/bwd_spills.txt" ;;
    bwdcheck)
      { timeout 90 python3 $B/bench_bwd.py check-bwd --S 128,1000,4160 --heads 32:8,4:1 \
          --check-impls ours,ours:allpairs
        timeout 90 python3 $B/bench_bwd.py check-bwd --S 16448 --heads 32:8 \
          --check-impls ours,ours:allpairs; } 2>&1 | grep -v Warn > "$OUT/bwd_check.jsonl"
      echo "checks ok: $(grep -c '"ok": true' "$OUT/bwd_check.jsonl") of $(grep -c '"check"' "$OUT/bwd_check.jsonl")"
      grep '"ok": false' "$OUT/bwd_check.jsonl" | cut -c1-300 ;;
    bwdbench)
      I=${BWD_IMPLS:-ours:base,ours:nopairs,ours,ours:allpairs}
      IFS=';' read -r -a sets <<<"${BWD_SETS:---S 16384,131072 --D 128;--S 131072 --D 64;--S 1048576 --D 128 --Hq 4 --Hkv 1}"
      for args in "${sets[@]}"; do
        MIN_REPS=${MIN_REPS:-2} timeout 150 python3 $B/bench_bwd.py bench-bwd $args --impls $I \
          --out "$OUT/bwd_bench.jsonl" 2>&1 | grep -v Warn | cut -c1-160
      done ;;
    failtests)
      # The run-time failures that must be errors, not aborts (issue 53's CHECK sweep, issue 50
      # item 4), from the engine's build (.device/bin.tar.xz).
      [ -x .device/bin/hopper_attention_test ] ||
        python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
      LD_LIBRARY_PATH=$PWD/.device/bin/lib timeout 120 .device/bin/hopper_attention_test \
        --gtest_filter='*HopperRunTimeFailure.*' > "$OUT/failtests.log" 2>&1
      echo "rc=$?"; grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) " "$OUT/failtests.log" ;;
    loratest)
      # Issue 52's GPU check: LoRA on the GPU tracks the CPU's losses (cuda_train_test).
      [ -x .device/bin/cuda_train_test ] ||
        python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
      LD_LIBRARY_PATH=$PWD/.device/bin/lib timeout 180 .device/bin/cuda_train_test \
        --gtest_filter='*Lora*:*TinyModelTracksCpuLossCurve*' > "$OUT/loratest.log" 2>&1
      echo "rc=$?"; grep -E "worst|^\[ +(OK|FAILED|PASSED|SKIPPED) " "$OUT/loratest.log" ;;
    *) bash lab/device_round_2026-12-06.sh "$part" ;;
  esac
done
