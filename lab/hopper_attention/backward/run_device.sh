#!/usr/bin/env bash
# Runs on the GPU machine from the repository root: lab/hopper_attention/backward/run_device.sh STEP...
# STEPs: build quick check check_variants bench bench_variants bench_long ncu.
# Logs and JSON lines go to $OUT (or ./out). The .so files are built on the CPU machine
# (backward/build_variants.sh, ../build.sh for the forward) and carried (the .venv with the CUTLASS
# headers is 240 MB, over the carry limit, so the device does not rebuild):
#   carry: ["lab/hopper_attention/build", "lab/hopper_attention/backward/build"]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
H=lab/hopper_attention
B=$H/backward
OUT="${OUT:-$B/out}"; mkdir -p "$OUT"
for step in "$@"; do
  case "$step" in
    build)
      for so in $B/build/libhopper_bwd*.so; do
        python3 -c "import ctypes; ctypes.CDLL('$so').hopper_attention_bwd" && echo "loads: $so"
      done
      [ -f $B/build/libhopper_bwd.so ] || (PATH=/usr/local/cuda/bin:$PATH $B/build.sh > "$OUT/build_bwd.log" 2>&1; tail -5 "$OUT/build_bwd.log")
      python3 -c "import ctypes; ctypes.CDLL('$H/build/libhopper_attention.so').hopper_attention_fwd" 2>/dev/null \
        && echo "prebuilt fwd .so loads" || (PATH=/usr/local/cuda/bin:$PATH $H/build.sh > "$OUT/build_fwd.log" 2>&1; tail -5 "$OUT/build_fwd.log")
      nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv ;;
    quick)
      # Smallest shapes first: a hang or fault shows here before the full check.
      timeout 60 python3 $B/bench_bwd.py check-bwd --S 128,1000 --heads 4:1 2>&1 | grep -v Warn | tee "$OUT/check_quick.jsonl" ;;
    check) timeout 240 python3 $B/bench_bwd.py check-bwd 2>&1 | grep -v Warn | tee "$OUT/check.jsonl"
           echo "ok: $(grep -c '"ok": true' "$OUT/check.jsonl") of $(grep -c '"check"' "$OUT/check.jsonl")" ;;
    check_variants)
      timeout 200 python3 $B/bench_bwd.py check-bwd --S 1000,4160 --heads 32:8 \
        --check-impls "${VARIANTS:-ours:atomic,ours:masc,ours:tile,ours:p32}" 2>&1 | grep -v Warn | tee "$OUT/check_variants.jsonl"
      echo "ok: $(grep -c '"ok": true' "$OUT/check_variants.jsonl") of $(grep -c '"check"' "$OUT/check_variants.jsonl")" ;;
    bench_variants) timeout 240 python3 $B/bench_bwd.py bench-bwd --S "${BENCH_S:-131072}" \
             --impls "${BENCH_IMPLS:-ours,ours:atomic,ours:masc,ours:tile,ours:p32}" ${BENCH_D:+--D $BENCH_D} --out "$OUT/bench_variants.jsonl" 2>&1 | grep -v Warn ;;
    bench) timeout 240 python3 $B/bench_bwd.py bench-bwd --S "${BENCH_S:-65536,131072}" \
             --impls "${BENCH_IMPLS:-ours,cudnn_sdpa}" ${BENCH_D:+--D $BENCH_D} --out "$OUT/bench.jsonl" 2>&1 | grep -v Warn ;;
    bench_long) MIN_REPS=1 timeout 500 python3 $B/bench_bwd.py bench-bwd --S "${BENCH_S:-262144,524288}" \
             --impls "${BENCH_IMPLS:-ours,cudnn_sdpa}" ${BENCH_D:+--D $BENCH_D} --out "$OUT/bench_long.jsonl" 2>&1 | grep -v Warn ;;
    ncu)
      # NCU_CFGS: "S D [variant]" entries separated by ';' (default: hd64 128K and hd128 64K).
      IFS=';' read -r -a cfgs <<<"${NCU_CFGS:-131072 64;65536 128}"
      for cfg in "${cfgs[@]}"; do
        set -- $cfg
        echo "=== bwd S=$1 D=$2 variant=${3:-default}" | tee -a "$OUT/ncu.txt"
        timeout 150 ncu --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy \
          --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section SchedulerStats \
          --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_red.sum,lts__t_sectors_op_read.sum,smsp__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
          -k regex:attn_bwd --launch-count 1 python3 $B/bench_bwd.py one --S $1 --D $2 ${3:+--variant $3} >> "$OUT/ncu.txt" 2>&1
        echo "rc=$?" >> "$OUT/ncu.txt"
      done
      grep -E "===|Duration|hit_rate|dram__|lts__|gmma|pipe_xu|wavefronts|per_second|Stall|Throughput|Registers Per|Dynamic Shared|Issue Slots|Eligible|Active Warps|No Eligible|rc=" "$OUT/ncu.txt" ;;
  esac
done
