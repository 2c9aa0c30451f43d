#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: bench/hopper_attention/run_device.sh STEP...
# STEPs: build check bench ncu. Logs and JSON lines go to $OUT (or ./out).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
H=bench/hopper_attention
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
    buildvariants)
      # Build the variants in parallel on the GPU machine's 16 cores; copies come back via $OUT.
      export PATH=/usr/local/cuda/bin:$PATH
      B=$PWD/$H/build; mkdir -p $B
      LIB_OUT=$B/lib_v2a.so $H/build.sh > $B/v2a.log 2>&1 &
      LIB_OUT=$B/lib_v2b.so $H/build.sh -DITHACA_HD128_STAGES=3 > $B/v2b.log 2>&1 &
      LIB_OUT=$B/lib_v2d.so $H/build.sh -DITHACA_POLY_EXP_EVERY=4 > $B/v2d.log 2>&1 &
      LIB_OUT=$B/lib_v2e.so $H/build.sh -DITHACA_POLY_EXP_EVERY=8 > $B/v2e.log 2>&1 &
      wait
      grep -hE "spill|Used|error" $B/v2*.log; ls -la $B
      cp $B/lib_v2*.so "$OUT/" ; cat $B/v2*.log > "$OUT/build_variants.log" ;;
    variants)
      # Each build/lib_*.so: quick correctness check + timings of our kernel only.
      for lib in $H/build/lib_v*.so; do
        n=$(basename $lib .so)
        HOPPER_ATTN_LIB=$lib timeout 60 python3 $H/bench.py check --quick 2>&1 | grep -v torch | tee -a "$OUT/variants_check.jsonl" | python3 -c "import sys,json; r=[json.loads(l) for l in sys.stdin if l.startswith('{')]; print('$n', 'check ok' if r and all(x['ok'] for x in r) else 'CHECK FAILED', max([x['o_rel_l2_err'] for x in r] or [0]))"
        HOPPER_ATTN_LIB=$lib OURS_NAME=$n timeout 80 python3 $H/bench.py bench --S "${VAR_S:-65536,262144}" --impls ours --out "$OUT/variants.jsonl" 2>&1 | grep -v torch
      done ;;
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
    final)
      # Full check of the default build, 512K hd128 again with 3 reps, and two variants at hd64
      # 64K/512K: v3 = K/V loads without the L2 evict-last hint, v5 = KV-head-major tile order.
      export PATH=/usr/local/cuda/bin:$PATH
      B=$PWD/$H/build
      LIB_OUT=$B/lib_v3.so $H/build.sh -DITHACA_KV_EVICT_LAST=0 > "$OUT/build_v3.log" 2>&1 &
      LIB_OUT=$B/lib_v5.so $H/build.sh -DITHACA_TILE_ORDER=1 > "$OUT/build_v5.log" 2>&1 &
      timeout 150 python3 $H/bench.py check 2>&1 | tee "$OUT/check.jsonl" | grep -c '"ok": true'
      MIN_REPS=3 timeout 60 python3 $H/bench.py bench --S 524288 --D 128 --impls ours --out "$OUT/bench.jsonl" 2>&1 | grep -v Warn
      wait; grep -hE "spill|error" "$OUT"/build_v*.log
      for v in v3 v5; do
        HOPPER_ATTN_LIB=$B/lib_$v.so timeout 60 python3 $H/bench.py check --quick 2>&1 | tee -a "$OUT/variants_check.jsonl" | grep -c '"ok": true'
        HOPPER_ATTN_LIB=$B/lib_$v.so OURS_NAME=ours_$v MIN_REPS=3 timeout 60 python3 $H/bench.py bench --S 65536,524288 --D 64 --impls ours --out "$OUT/variants.jsonl" 2>&1 | grep -v Warn
      done
      for cfg in "ours 524288 128 $B/libhopper_attention.so" "ours 524288 64 $B/lib_v3.so" "ours 524288 64 $B/lib_v5.so"; do
        set -- $cfg
        echo "=== L2 impl=$1 S=$2 D=$3 lib=$(basename $4)" | tee -a "$OUT/ncu_l2.txt"
        HOPPER_ATTN_LIB=$4 timeout 45 ncu --clock-control none --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
          -k regex:attn_fwd --launch-count 1 python3 $H/bench.py one --impl $1 --S $2 --D $3 >> "$OUT/ncu_l2.txt" 2>&1
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
