#!/bin/bash
# Issue 50, 2026-12-07 (seventh session): the head_dim-128 forward with longer key blocks
# (kBlockN 160, 176 and 192 against 128, `-DITHACA_HD128_BLOCK_N`; 176 and 192 only longest
# first at cluster 1, their pairs' consumers spill 126-172 STL/LDL against 8), and the power ceiling: a bf16 GEMM
# sustained at the card's cap beside the own forward and backward sustained, clock and power
# sampled. On the GPU machine, with lab/hopper_attention/build (libhopper_n128/160/176/192.so, built
# here by `LIB_OUT=.../libhopper_nN.so build.sh -DITHACA_HD128_BLOCK_N=N`) and .device/bin.tar.xz
# carried: `lab/hopper_attention/blockn_round.sh check bench ceiling` (round 1).
# Round 2, after round 1 found 192 ahead at cluster 1 and the pairs' spills came from the
# documents' and windows' per-row state: the kernel built for the causal mask alone (kMasks
# false), libhopper_m128.so (-DITHACA_HD128_CAUSAL_BLOCK_N=128) and libhopper_m192.so (the new
# default), beside round 1's libhopper_n128.so (the kernel before): `check2 bench2 gemm16k`, then
# with the engine built with it `engine` (its GPU tests and attention_bench at the issue's shapes).
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
for part in "$@"; do
  mark "begin $part"
  case "$part" in
    check)
      timeout 150 python3 $H/bench.py check --check-impls @n128,@n160,@n160_c2,@n176_c1,@n192_c1,@n192_c4 \
        2>&1 | grep -v Warn > "$OUT/check.jsonl"
      timeout 60 python3 $H/bench.py check --quick --heads 4:1 --check-impls @n160_c2,@n192_c1 \
        2>&1 | grep -v Warn >> "$OUT/check.jsonl"
      echo "checks ok: $(grep -c '"ok": true' "$OUT/check.jsonl") of $(grep -c '"check"' "$OUT/check.jsonl")"
      grep -v '"ok": true' "$OUT/check.jsonl" | cut -c1-300 | head -20 ;;
    bench)
      MIN_REPS=4 timeout 150 python3 $H/bench.py bench --S 16384,131072 --D 128 \
        --impls @n128,@n160,@n176_c1,@n192_c1,@n128_c1,@n160_c1,@n128,@n160,@n192_c1 \
        --out "$OUT/bench.jsonl" 2>&1 | grep -v Warn | cut -c1-140
      MIN_REPS=2 timeout 120 python3 $H/bench.py bench --S 524288 --D 128 \
        --impls @n128,@n160,@n192_c1,@n128 --out "$OUT/bench.jsonl" 2>&1 | grep -v Warn | cut -c1-140
      MIN_REPS=2 timeout 90 python3 $H/bench.py bench --S 1048576 --D 128 --heads 4:1 \
        --impls @n128,@n160,@n192_c1,@n128 --out "$OUT/bench.jsonl" 2>&1 | grep -v Warn |
        cut -c1-140 ;;
    check2)
      timeout 150 python3 $H/bench.py check --check-impls @m128,@m192,@m192_c2,@m192_c4 \
        2>&1 | grep -v Warn > "$OUT/check2.jsonl"
      timeout 60 python3 $H/bench.py check --quick --heads 4:1 --check-impls @m192_c2,@m192_c4 \
        2>&1 | grep -v Warn >> "$OUT/check2.jsonl"
      echo "checks ok: $(grep -c '"ok": true' "$OUT/check2.jsonl") of $(grep -c '"check"' "$OUT/check2.jsonl")"
      grep -v '"ok": true' "$OUT/check2.jsonl" | cut -c1-300 | head -20 ;;
    bench2)
      MIN_REPS=4 timeout 100 python3 $H/bench.py bench --S 16384,131072 --D 128 \
        --impls @n128,@m192,@m192_c4,@m128,@n128,@m192 \
        --out "$OUT/bench2.jsonl" 2>&1 | grep -v Warn | cut -c1-140
      MIN_REPS=2 timeout 60 python3 $H/bench.py bench --S 524288 --D 128 \
        --impls @n128,@m192 --out "$OUT/bench2.jsonl" 2>&1 | grep -v Warn | cut -c1-140
      MIN_REPS=2 timeout 40 python3 $H/bench.py bench --S 1048576 --D 128 --heads 4:1 \
        --impls @n128,@m192 --out "$OUT/bench2.jsonl" 2>&1 | grep -v Warn | cut -c1-140 ;;
    tests)  # the engine's attention tests and its training test, built with the change
      for t in hopper_attention_test attention_test cuda_ops_test cuda_train_test; do
        timeout 150 .device/bin/$t > "$OUT/$t.log" 2>&1
        echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')"
        grep -E "^\[  FAILED  \]" "$OUT/$t.log" | head -5
      done ;;
    gemm16k)
      timeout 60 python3 $H/ceiling/gemm_sustained.py --n 16384 --seconds 20 |
        tee -a "$OUT/gemm.jsonl" | tail -1 ;;
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
      timeout 60 python3 $H/ceiling/gemm_sustained.py --seconds 20 | tee "$OUT/gemm.jsonl" | tail -2
      for pass in fwd bwd; do
        mark "attention $pass"
        timeout 120 .device/bin/attention_bench --shapes=128:32:8:131072 --forward=hopper \
          --backward=hopper --passes=$pass --iters=${ITERS:-30} 2>>"$OUT/attention.log" |
          tee -a "$OUT/attention.jsonl" | cut -c1-240
      done ;;
  esac
  mark "end $part"
done
