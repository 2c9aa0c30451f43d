#!/bin/bash
# Does running cuDNN's forward as query chunks (ITHACA_CUDNN_FWD_QCHUNK) win back the speed its
# forward loses per FLOP at long S? `bench/qchunk_probe.sh BIN OUT [train]`: the forward at 256K
# and 512K (hd 64, GQA 32/8) whole and in chunks of 32K/64K/128K; with "train", a 512K
# attention-aware step with the best chunk when it beats whole calls by more than 3%.
set -uo pipefail
BIN=${1:?bin dir}
OUT=${2:?out dir}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN/lib:/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export ITHACA_CUDNN_PLAN=0,0  # the heuristics' first choice: the sweep's fastest
for c in 0 32768 65536 131072; do
  ITHACA_CUDNN_FWD_QCHUNK=$c timeout 120 "$BIN/attention_bench" \
    --shapes=64:32:8:262144,64:32:8:524288 --passes=fwd --iters=2 \
    | sed "s/\"impl\": \"cudnn\"/\"impl\": \"cudnn-fwd-qchunk-$c\"/" | tee -a "$OUT/qchunk.jsonl"
done
[ "${3:-}" = train ] || exit 0
best=$(python3 - "$OUT/qchunk.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ms = {}
for r in rows:
    if r["S"] == 524288:
        ms[int(r["impl"].rsplit("-", 1)[1])] = r["ms"]
c = min(ms, key=ms.get)
print(c if 0 in ms and ms[c] < 0.97 * ms[0] else 0)
PY
)
echo "best chunk at 512K: $best"
[ "$best" = 0 ] && exit 0
ITHACA_CUDNN_FWD_QCHUNK=$best timeout 300 "$BIN/train_bench" --checkpoint=attention-aware \
  --seq_lens=524288 --warmup=0 --steps=1 --tag="fwd-qchunk-$best" | tee -a "$OUT/train.jsonl"
