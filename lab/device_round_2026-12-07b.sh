#!/bin/bash
# The device calls of the 2026-12-07 (second) session, issue 51's ring on GPUs:
#   `lab/device_round_2026-12-07b.sh PART...` with .device/bin.tar.xz carried.
#   chunktest  attention_test's AttentionChunkTest (ring pieces against the CPU oracle; the
#              off-diagonal pieces of equal length on cuDNN without the causal mask)
#   piecebench attention_bench: a ring piece (no causal mask) beside causal attention at 256K
#              tokens, the shapes of Qwen2.5-7B (7:1) and Llama-3-8B (8:2) under Ulysses 4
#   ring1m     rank 0 of 8 rehearsed at 1M on one decoder layer, auto's plan on an 80 GB GPU with a
#              DGX H100's links and host: Qwen2.5-7B as 4 x 2 and as sp 4 x dp 2, Llama-3-8B as
#              4 x 2 and as 8; and the same at 32K on one and two layers (bench/project_layers.py
#              takes what does not repeat per layer from those)
#   probe32m   the memory probe of rank 0 of Llama-3-8B on 64 ranks over 8 nodes at 32M (PROBE_S),
#              whole model, attention windowed, auto's plan for 80 GB and this machine's host
#              (its memory as one rank's share: a DGX's 2 TiB would be 256 GiB a rank)
#   twogpu     (two GPUs) nccl_comm_test (SendRecv between two real GPUs), and Llama-3.2-1B trained
#              3 steps by 2 ranks over NCCL at 64K as ring 2 (u 1) and as Ulysses 2: the same
#              losses, and the two layouts' step times
# Results under $OUT; RATES (default the committed H100 table) for the predictions.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
[ -x .device/bin/parallel_bench ] ||
  python3 -c "import tarfile; tarfile.open('.device/bin.tar.xz').extractall('.device')"
BIN=$PWD/.device/bin
export LD_LIBRARY_PATH=$BIN/lib
RATES=${RATES:-engine/plan/rates/h100.txt}
rehearse() {  # MODEL WORLD SP S LAYERS EXTRA...
  local model=$1 world=$2 sp=$3 s=$4 layers=$5
  shift 5
  timeout ${STEP_TIMEOUT:-240} "$BIN/parallel_bench" --backend=cuda --rehearse --world=$world \
    --sp=$sp --model=$model --seq_lens=$s --layers=$layers --planner_settings \
    --device_memory_gib=80 --node_host_gib=2048 --link=h100-sxm --warmup=1 --steps=1 \
    --compute_step=false --rates=$RATES "$@" 2>>"$OUT/ring.log" | tee -a "$OUT/ring.jsonl" |
    python3 -c "import json,sys
for l in sys.stdin:
  d=json.loads(l); print(d['model'], 'S', d['S'], 'sp', d['sp'], 'ring', d.get('ring'), 'dp', d['dp'], 'layers', d['layers'], 'step_s', d.get('step_s'), 'pred', d.get('predicted_step_s'), d['techniques'].get('attention'))"
  echo "  rc=${PIPESTATUS[0]}"
}
for part in "$@"; do
  echo "=== $part ($(date -u +%T))"
  case "$part" in
    chunktest)
      timeout 120 "$BIN/attention_test" --gtest_filter='*AttentionChunk*' >"$OUT/chunktest.log" 2>&1
      echo "rc=$?"
      grep -E "off-diagonal|^\[ +(OK|FAILED|PASSED|SKIPPED) " "$OUT/chunktest.log" ;;
    piecebench)
      timeout 200 "$BIN/attention_bench" --shapes=128:7:1:262144,128:8:2:262144 --forward=auto \
        --backward=auto --ring_piece --passes=fwd,bwd --iters=3 2>"$OUT/piecebench.log" |
        tee "$OUT/piecebench.jsonl" | python3 -c "import json,sys
for l in sys.stdin:
  d=json.loads(l); print(d['mask'], d['hq'], d['hkv'], d['S'], d['pass'], d['impl'], round(d['tflops'],1), round(d['ms'],1))"
      echo "rc=${PIPESTATUS[0]}" ;;
    ring1m)
      for layers in 1 2; do
        rehearse qwen2.5-7b 8 8 32768 $layers
        rehearse qwen2.5-7b 8 4 32768 $layers
        rehearse llama-3-8b 8 8 32768 $layers --ring=2
        rehearse llama-3-8b 8 8 32768 $layers --ring=1
      done
      rehearse qwen2.5-7b 8 8 1048576 1
      rehearse qwen2.5-7b 8 4 1048576 1
      rehearse llama-3-8b 8 8 1048576 1 --ring=2
      rehearse llama-3-8b 8 8 1048576 1 --ring=1 ;;
    probe32m)
      HOST_GIB=$(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo)
      timeout ${PROBE_TIMEOUT:-400} "$BIN/parallel_bench" --backend=cuda --rehearse --world=64 \
        --nodes=8 --sp=64 --model=llama-3-8b --seq_lens=${PROBE_S:-33554432} --probe=2048 \
        --planner_settings --device_memory_gib=80 --node_host_gib=$((HOST_GIB * 8)) \
        --link=h100-sxm --warmup=0 --steps=1 \
        --compute_step=false --rates=$RATES 2>"$OUT/probe32m.log" | tee "$OUT/probe32m.jsonl" |
        cut -c1-400
      echo "probe rc=${PIPESTATUS[0]} (this host: $HOST_GIB GiB)"; tail -5 "$OUT/probe32m.log" ;;
    twogpu)
      timeout 120 "$BIN/nccl_comm_test" >"$OUT/nccl.log" 2>&1
      echo "nccl rc=$?"; grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) " "$OUT/nccl.log"
      for r in 1 2; do
        timeout 200 "$BIN/parallel_bench" --backend=cuda --world=2 --sp=2 --ring=$r \
          --model=llama-3.2-1b --seq_lens=65536 --warmup=0 --steps=3 --tag=ring$r \
          2>>"$OUT/twogpu.log" | tee -a "$OUT/twogpu.jsonl" | cut -c1-250
        echo "ring $r rc=${PIPESTATUS[0]}"
      done
      grep -E "step [0-9]" "$OUT/twogpu.log" ;;
  esac
done
