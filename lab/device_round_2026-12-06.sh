#!/bin/bash
# The device calls of 2026-12-06 (issue 50), on an H100: `lab/device_round_2026-12-06.sh PART...`
#   pairs      the forward's v7 rule (pairs of row blocks at head_dim 128 from 64K, cluster 2)
#              against the kernel before it (lab/hopper_attention/build/libhopper_base.so):
#              checks, then timings at 32K-128K
#   tests      the GPU suite (bench/device_session.sh tests)
#   hoppertests  the Hopper attention tests this session's changes touch (a filter)
#   attn       attention_bench at the issue's shapes, own kernels both ways (and cuDNN's)
#   calibrate  bench/calibrate on this GPU: OUT/h100.txt (engine/plan/rates/h100.txt)
#   rehearse   Llama-3-8B rank 0 of 8, auto's plan, whole steps at REHEARSE_S (128K default),
#              predicted with OUT/h100.txt; the node's host a DGX's (2 TiB), the GPU capped at 80 GiB
#   probe5m    the memory probe of that rank at 5M on 80 GiB with this host's memory
# Results under $OUT (at most 8 files come back).
set -uo pipefail
[ -x .device/bin/parallel_bench ] ||
  python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
BIN=$PWD/.device/bin
export LD_LIBRARY_PATH=$BIN/lib NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
H=lab/hopper_attention
for part in "$@"; do
  echo "=== $part ($(date -u +%T))"
  case "$part" in
    pairs)
      export HOPPER_ATTN_BASE_LIB=$H/build/libhopper_base.so
      { timeout 60 python3 $H/bench.py check --check-impls ours,ours_c1,ours_c2
        timeout 40 python3 $H/bench.py check --quick --heads 4:1 --check-impls ours,ours_c2; } 2>&1 |
        grep -v Warn > "$OUT/check_pairs.jsonl"
      echo "checks ok: $(grep -c '"ok": true' "$OUT/check_pairs.jsonl") of $(grep -c '"check"' "$OUT/check_pairs.jsonl")"
      MIN_REPS=3 timeout 90 python3 $H/bench.py bench --D 128 --S 32768,65536,131072 \
        --impls base,ours,ours_c1 --out "$OUT/bench_pairs.jsonl" 2>&1 | grep -v Warn | cut -c1-120
      MIN_REPS=3 timeout 40 python3 $H/bench.py bench --D 64 --S 131072 --impls base,ours \
        --out "$OUT/bench_pairs.jsonl" 2>&1 | grep -v Warn | cut -c1-120
      ;;
    tests)
      bash bench/device_session.sh "$BIN" "$OUT" tests > "$OUT/tests.out" 2>&1
      grep -E "^(PASSED|FAILED)" "$OUT/tests.out"; tail -1 "$OUT/tests.out"
      ;;
    hoppertests)
      # The Hopper attention tests that cover this session's changes (the forward in pairs at
      # 64K head_dim 128 against cuDNN, every small shape and mask against the CPU oracle, the
      # run-time failure), when the whole suite does not fit the device time.
      timeout ${HT_TIMEOUT:-200} "$BIN/hopper_attention_test" \
        --gtest_filter='*HopperVsCpu.*:*HopperMasksVsCpu.*:*HopperRunTimeFailure.*:*VsCudnn*S65536*d128*' \
        > "$OUT/hopper_attention_test.log" 2>&1
      echo "hopper_attention_test rc=$?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$OUT/hopper_attention_test.log" | head
      ;;
    attn)
      # The 32:8 shapes with both kernels each way; a rank of Llama-3-8B under Ulysses 8 (4:1 at
      # 1M) with the own kernels only (each pass takes seconds there).
      for shape in ${ATTN_SHAPES:-128:32:8:65536 128:32:8:131072 64:32:8:131072}; do
        timeout 150 "$BIN/attention_bench" --shapes=$shape --forward=hopper,cudnn \
          --backward=hopper,cudnn --iters=3 --passes=fwd,bwd,fwd+bwd 2>>"$OUT/attn.log" |
          tee -a "$OUT/attn.jsonl" | cut -c1-160
      done
      timeout 150 "$BIN/attention_bench" --shapes=128:4:1:1048576 --forward=hopper \
        --backward=hopper --iters=2 --passes=fwd,bwd 2>>"$OUT/attn.log" |
        tee -a "$OUT/attn.jsonl" | cut -c1-160
      ;;
    calibrate)
      DEVICE=h100 timeout ${CALIBRATE_TIMEOUT:-240} bash bench/step_time_session.sh "$BIN" "$OUT" \
        calibrate > "$OUT/calibrate.out" 2>&1
      tail -2 "$OUT/calibrate.out"; grep -c . "$OUT/h100.txt"
      ;;
    rehearse)
      for s in ${REHEARSE_S:-131072}; do
        DEVICE=h100 WARMUP=1 STEP_TIMEOUT=${STEP_TIMEOUT:-300} \
          bash bench/step_time_session.sh "$BIN" "$OUT" rehearse:llama-3-8b:8:$s:--recompute=auto+--link=h100-sxm \
          2>/dev/null | cut -c1-200
      done
      ;;
    probe5m)
      # The memory probe of rank 0 of 8 at 5M on an 80 GB GPU (issue 50, item 4): auto's plan
      # with this host's memory; a step that does not fit ends in an error, never an abort.
      HOST_GIB=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
      timeout ${PROBE_TIMEOUT:-300} "$BIN/parallel_bench" --rehearse --world=8 --sp=8 \
        --model=llama-3-8b --seq_lens=5242880 --probe=2048 --planner_settings \
        --device_memory_gib=80 --node_host_gib=$((HOST_GIB * 8)) --link=h100-sxm --warmup=0 \
        --steps=1 --compute_step=false 2>"$OUT/probe5m.log" | tee "$OUT/probe5m.jsonl" | cut -c1-300
      echo "probe rc=${PIPESTATUS[0]}"; tail -4 "$OUT/probe5m.log"
      ;;
  esac
done
