#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: lab/hopper_attention/run_device.sh STEP...
# STEPs: build check bench l2 v5final cluster zigzag hd64p ncu (the kernel is the engine's own, built by build.sh; the
# tile-order and pipeline variants of notes/INDEX.md were built from the experimental copy this
# directory held until the kernel moved into the engine: git show 710544f:bench/hopper_attention/hopper_fwd.cu). Logs and JSON lines go to $OUT (or ./out).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
H=lab/hopper_attention
OUT="${OUT:-$H/out}"; mkdir -p "$OUT"
for step in "$@"; do
  case "$step" in
    build)
      python3 -c "import ctypes; ctypes.CDLL('$H/build/libhopper_attention.so').hopper_attention_fwd" 2>/dev/null \
        && echo "prebuilt .so loads" || (PATH=/usr/local/cuda/bin:$PATH $H/build.sh > "$OUT/build.log" 2>&1; tail -5 "$OUT/build.log")
      nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv ;;
    check) timeout 150 python3 $H/bench.py check 2>&1 | tee "$OUT/check.jsonl" ;;
    bench) timeout 200 python3 $H/bench.py bench --S "${BENCH_S:-65536,131072,262144,524288}" \
             --impls "${BENCH_IMPLS:-ours,cudnn_sdpa,flash_sdpa}" --out "$OUT/bench.jsonl" 2>&1 | grep -v Warning ;;
    l2)
      # L2 hit rate and DRAM reads of one launch at short vs long S (few metrics: one pass).
      for cfg in "ours 65536 64 regex:attn_fwd" "ours 524288 64 regex:attn_fwd" "cudnn_sdpa 524288 64 regex:sdpa|fmha|fprop|cudnn|flash|attn"; do
        set -- $cfg
        echo "=== L2 impl=$1 S=$2 D=$3" | tee -a "$OUT/ncu_l2.txt"
        timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
          -k "$4" --launch-count 1 python3 $H/bench.py one --impl $1 --S $2 --D $3 >> "$OUT/ncu_l2.txt" 2>&1
        echo "rc=$?" >> "$OUT/ncu_l2.txt"
      done
      grep -E "===|gpu__time|hit_rate|dram__|rc=" "$OUT/ncu_l2.txt" ;;
    v5final)
      # Default build with the KV-head-major tile order: quick check, all S both D, and the
      # clock / DRAM / L2 figures of one hd128 64K launch.
      timeout 60 python3 $H/bench.py check --quick 2>&1 | tee "$OUT/check_v5.jsonl" | grep -c '"ok": true'
      MIN_REPS=3 timeout 70 python3 $H/bench.py bench --D 128,64 --impls ours --out "$OUT/bench_v5.jsonl" 2>&1 | grep -v Warn
      for cfg in "65536 128"; do
        set -- $cfg
        echo "=== clock/L2 impl=ours(v5) S=$1 D=$2" | tee -a "$OUT/ncu_v5.txt"
        timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
          -k regex:attn_fwd --launch-count 1 python3 $H/bench.py one --impl ours --S $1 --D $2 >> "$OUT/ncu_v5.txt" 2>&1
      done
      grep -E "===|gpu__time|per_second|hit_rate|dram__" "$OUT/ncu_v5.txt" ;;
    cluster)
      # v6 (K/V multicast): forced cluster sizes 1/2/4 of this build against the kernel before
      # clusters, $H/build/libhopper_base.so, built here with:
      #   mkdir /tmp/b && git archive 5b402ed engine/backend/cuda bench/hopper_attention | tar -x -C /tmp/b
      #   CUTLASS_INCLUDE=… LIB_OUT=$PWD/$H/build/libhopper_base.so /tmp/b/bench/hopper_attention/build.sh
      export HOPPER_ATTN_BASE_LIB=$H/build/libhopper_base.so
      for impls in base,ours_c1 ours_c2 ours_c4; do
        timeout 60 python3 $H/bench.py check --check-impls $impls 2>&1 | grep -v Warn >> "$OUT/check_cluster.jsonl"
      done
      grep -c '"ok": true' "$OUT/check_cluster.jsonl"
      timeout 60 python3 $H/bench.py same --S 65536,262144 --impls ours,ours_c2,ours_c4 2>&1 | grep -v Warn | tee "$OUT/same_cluster.jsonl"
      MIN_REPS=2 timeout 150 python3 $H/bench.py bench --impls base,ours_c2,ours_c4 --out "$OUT/bench_cluster.jsonl" 2>&1 | grep -v Warn
      for impl in base ours_c2 ours_c4; do
        echo "=== L2 impl=$impl S=524288 D=64" | tee -a "$OUT/ncu_cluster.txt"
        timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
          -k regex:attn_fwd --launch-count 1 python3 $H/bench.py one --impl $impl --S 524288 --D 64 >> "$OUT/ncu_cluster.txt" 2>&1
      done
      grep -E "===|gpu__time|per_second|hit_rate|dram__|grid_size" "$OUT/ncu_cluster.txt" ;;
    hd64p)
      # s8: head_dim 64 in pairs with 2 consumer warpgroups (build_s8.sh builds both libraries
      # here; carry lab/hopper_attention/build) against the engine's kernel as it is (base): checks
      # at 32:8 and 4:1 heads, then timings per cluster size at 16K, 128K, 512K and a rank's 4:1
      # at 1M. The bar at hd64 is 600 TFLOPS; base is 533 at 128K and 503 at 512K (H100).
      export HOPPER_ATTN_BASE_LIB=$H/build/libhopper_base.so
      timeout 60 python3 $H/bench.py check --quick --D 64 --check-impls ours,ours_c1,ours_c2 2>&1 | grep -v Warn > "$OUT/check_s8.jsonl"
      timeout 60 python3 $H/bench.py check --quick --D 64 --heads 4:1 --check-impls ours,ours_c2 2>&1 | grep -v Warn >> "$OUT/check_s8.jsonl"
      echo "checks ok: $(grep -c '"ok": true' "$OUT/check_s8.jsonl") of $(grep -c '"check"' "$OUT/check_s8.jsonl")"
      B=$OUT/bench_s8.jsonl
      MIN_REPS=2 timeout 120 python3 $H/bench.py bench --D 64 --S 16384,131072,524288 --impls base,ours_c1,ours_c2,ours_c4 --out $B 2>&1 | grep -v Warn | cut -c1-150
      MIN_REPS=2 timeout 90 python3 $H/bench.py bench --D 64 --S 1048576 --heads 4:1 --impls base,ours_c2 --out $B 2>&1 | grep -v Warn | cut -c1-150 ;;
    zigzag)
      # v7 (pairs of row blocks walked up then down, every cluster in phase) against the kernel
      # before it ($H/build/libhopper_base.so, built from the parent commit): checks at 32:8 and
      # 4:1 heads, bit-for-bit is not expected (the key order changes), then timings per cluster
      # size and ncu's DRAM bytes at hd128 512K.
      export HOPPER_ATTN_BASE_LIB=$H/build/libhopper_base.so
      nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
      timeout 90 python3 $H/bench.py check --check-impls ours,ours_c1,ours_c4 2>&1 | grep -v Warn > "$OUT/check_zz.jsonl"
      timeout 60 python3 $H/bench.py check --quick --heads 4:1 --check-impls ours,ours_c1,ours_c2,ours_c4 2>&1 | grep -v Warn >> "$OUT/check_zz.jsonl"
      echo "checks ok: $(grep -c '"ok": true' "$OUT/check_zz.jsonl") of $(grep -c '"check"' "$OUT/check_zz.jsonl")"
      grep '"ok": false' "$OUT/check_zz.jsonl" | head -5
      B=$OUT/bench_zz.jsonl
      MIN_REPS=2 timeout 60 python3 $H/bench.py bench --D 128 --S 16384,131072 --impls base,ours_c1,ours_c2,ours_c4,cudnn_sdpa --out $B 2>&1 | grep -v Warn | cut -c1-150
      MIN_REPS=2 timeout 80 python3 $H/bench.py bench --D 64 --S 131072,524288 --impls base,ours_c1,ours_c2,ours_c4 --out $B 2>&1 | grep -v Warn | cut -c1-150
      MIN_REPS=2 timeout 90 python3 $H/bench.py bench --D 128 --S 524288 --impls base,ours_c1,ours_c2,ours_c4 --out $B 2>&1 | grep -v Warn | cut -c1-150
      MIN_REPS=1 timeout 90 python3 $H/bench.py bench --heads 4:1 --D 128 --S 1048576,2097152 --impls base,ours_c1,ours_c2,ours_c4 --out $B 2>&1 | grep -v Warn | cut -c1-150
      for impl in base ours_c1 ours_c2; do
        echo "=== L2 impl=$impl S=524288 D=128" >> "$OUT/ncu_zz.txt"
        timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,launch__grid_size \
          -k regex:attn_fwd --launch-count 1 python3 $H/bench.py one --impl $impl --S 524288 --D 128 >> "$OUT/ncu_zz.txt" 2>&1
      done
      grep -E "===|gpu__time|per_second|hit_rate|dram__|grid_size" "$OUT/ncu_zz.txt" ;;
    ncu)
      NCU="ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section WarpStateStats"
      Q=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}')
      M=""
      for m in sm__pipe_tensor_op_gmma_cycles_active:.avg.pct_of_peak_sustained_elapsed \
               sm__inst_executed_pipe_tensor_op_gmma:.avg.pct_of_peak_sustained_elapsed \
               sm__pipe_xu_cycles_active:.avg.pct_of_peak_sustained_elapsed \
               sm__inst_executed_pipe_xu:.avg.pct_of_peak_sustained_elapsed \
               sm__pipe_fma_cycles_active:.avg.pct_of_peak_sustained_elapsed \
               sm__pipe_alu_cycles_active:.avg.pct_of_peak_sustained_elapsed \
               lts__t_sector_hit_rate:.pct dram__throughput:.avg.pct_of_peak_sustained_elapsed dram__bytes_read:.sum; do
        echo "$Q" | grep -qx "${m%%:*}" && M="${M:+$M,}${m%%:*}${m#*:}"
      done
      ncu --query-metrics --chip gh100 2>/dev/null | grep -E "gmma|pipe_xu|pipe_fma |lts__t_sector_hit" > "$OUT/ncu_metric_names.txt"
      echo "extra metrics: $M" | tee "$OUT/ncu.txt"
      for cfg in "ours 131072 64 regex:attn_fwd" "cudnn_sdpa 131072 64 regex:sdpa|fmha|fprop|cudnn|flash|attn" \
                 "ours 65536 128 regex:attn_fwd" "cudnn_sdpa 65536 128 regex:sdpa|fmha|fprop|cudnn|flash|attn"; do
        set -- $cfg
        echo "=== impl=$1 S=$2 D=$3" | tee -a "$OUT/ncu.txt"
        timeout 50 $NCU ${M:+--metrics $M} -k "$4" --launch-count 1 python3 $H/bench.py one --impl $1 --S $2 --D $3 >> "$OUT/ncu.txt" 2>&1
        echo "rc=$?" >> "$OUT/ncu.txt"
      done
      grep -E "===|Duration|hit_rate|dram__|pipe_|Stall|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Shared Memory Config|Dynamic Shared|gmma|Block Size|Grid Size|Executed Ipc A|rc=" "$OUT/ncu.txt" ;;
  esac
done
