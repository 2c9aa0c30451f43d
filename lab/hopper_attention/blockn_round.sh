#!/bin/bash
# Issue 50, 2026-12-07 (seventh session): the head_dim-128 forward with longer key blocks
# (kBlockN 160, 176 and 192 against 128; 176 and 192 only longest first at cluster 1, their
# pairs' consumers spill 126-172 STL/LDL against 8), and the power ceiling: a bf16 GEMM
# sustained at the card's cap beside the own forward and backward sustained, clock and power
# sampled. On the GPU machine, with lab/hopper_attention/build and .device/bin.tar.xz carried.
# Round 1: `check bench ceiling`, libhopper_n128/160/176/192.so built here by
# `LIB_OUT=.../libhopper_nN.so build.sh -DITHACA_HD128_BLOCK_N=N` (a working-tree switch that
# notes/blockn/blockn-2026-12-07.patch replaced by ITHACA_HD128_CAUSAL_BLOCK_N).
# Round 2, after round 1 found 192 ahead at cluster 1 and the pairs' spills came from the
# documents' and windows' per-row state: the kernel built for the causal mask alone (kMasks
# false), libhopper_m128.so (-DITHACA_HD128_CAUSAL_BLOCK_N=128) and libhopper_m192.so (the new
# default), beside round 1's libhopper_n128.so (the kernel before), with the engine built
# with it: `check2 bench2 engine` (the GPU suite and attention_bench at the issue's shapes).
# `GEMM_N=16384 blockn_round.sh ceiling` repeats the ceiling with a larger GEMM.
set -uo pipefail
export PYTHONUNBUFFERED=1
H=lab/hopper_attention
[ -x .device/bin/attention_bench ] ||
  python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
export LD_LIBRARY_PATH=$PWD/.device/bin/lib
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits \
  -lms 250 >> "$OUT/smi.csv" &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
mark() { echo "$(date -u +%Y/%m/%d\ %H:%M:%S.%3N) $*" | tee -a "$OUT/marks.txt"; }
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
# checks NAME IMPLS IMPLS_4TO1: the fp32 reference checks (32:8, then 4:1 quick) into NAME.jsonl.
checks() {
  timeout 150 python3 $H/bench.py check --check-impls "$2" 2>&1 | grep -v Warn > "$OUT/$1.jsonl"
  timeout 60 python3 $H/bench.py check --quick --heads 4:1 --check-impls "$3" 2>&1 |
    grep -v Warn >> "$OUT/$1.jsonl"
  echo "checks ok: $(grep -c '"ok": true' "$OUT/$1.jsonl") of $(grep -c '"check"' "$OUT/$1.jsonl")"
  grep -v '"ok": true' "$OUT/$1.jsonl" | cut -c1-300 | head -20
}
# timed NAME REPS SECONDS S HEADS IMPLS: forward timings at head_dim 128 into NAME.jsonl.
timed() {
  MIN_REPS=$2 timeout $3 python3 $H/bench.py bench --S $4 --D 128 --heads $5 --impls "$6" \
    --out "$OUT/$1.jsonl" 2>&1 | grep -v Warn | cut -c1-140
}
for part in "$@"; do
  mark "begin $part"
  case "$part" in
    check) checks check @n128,@n160,@n160_c2,@n176_c1,@n192_c1,@n192_c4 @n160_c2,@n192_c1 ;;
    bench)
      timed bench 4 150 16384,131072 32:8 \
        @n128,@n160,@n176_c1,@n192_c1,@n128_c1,@n160_c1,@n128,@n160,@n192_c1
      timed bench 2 120 524288 32:8 @n128,@n160,@n192_c1,@n128
      timed bench 2 90 1048576 4:1 @n128,@n160,@n192_c1,@n128 ;;
    check2) checks check2 @m128,@m192,@m192_c2,@m192_c4 @m192_c2,@m192_c4 ;;
    bench2)
      timed bench2 4 100 16384,131072 32:8 @n128,@m192,@m192_c4,@m128,@n128,@m192
      timed bench2 2 60 524288 32:8 @n128,@m192
      timed bench2 2 40 1048576 4:1 @n128,@m192 ;;
    engine)
      bench/device_session.sh .device/bin "$OUT" tests 2>&1 | tail -3
      timeout 200 .device/bin/attention_bench \
        --shapes=128:32:8:16384,128:32:8:131072,128:4:1:1048576,64:32:8:131072 --forward=hopper \
        --backward=hopper --passes=fwd,bwd --iters=${ITERS:-5} 2>>"$OUT/attention2.log" |
        tee -a "$OUT/attention2.jsonl" | python3 -c "import json,sys
for l in sys.stdin:
  d=json.loads(l); print(d['head_dim'], d['hq'], d['hkv'], d['S'], d['pass'], d['impl'], round(d['tflops'], 1))"
      ;;
    ceiling)
      mark "gemm"
      timeout 60 python3 $H/ceiling/gemm_sustained.py --n ${GEMM_N:-8192} --seconds 20 |
        tee -a "$OUT/gemm.jsonl" | tail -2
      for pass in fwd bwd; do
        mark "attention $pass"
        timeout 120 .device/bin/attention_bench --shapes=128:32:8:131072 --forward=hopper \
          --backward=hopper --passes=$pass --iters=${ITERS:-30} 2>>"$OUT/attention.log" |
          tee -a "$OUT/attention.jsonl" | cut -c1-240
      done ;;
  esac
  mark "end $part"
done
