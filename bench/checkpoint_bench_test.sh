#!/bin/bash
# Smoke test of checkpoint_bench on the CPU: two ranks save and load the tiny model, the loaded
# weights equal the saved ones, and each rank's lines say what it held on the host: to save, one
# unit's tensors of one kind plus what waits for the writer thread (an upper bound; for this tiny
# model the 2 GiB queue allows its whole share); to load, one unit's slices at a time, clearly
# less than its half of the state (0.21 for the tiny model, whose embedding is the largest unit;
# loading every slice first held 0.5).
set -euo pipefail
BENCH=$1
OUT="$TEST_TMPDIR/out.jsonl"
OMP_NUM_THREADS=1 "$BENCH" --model tiny --backend cpu --nproc 2 --dir "$TEST_TMPDIR/ckpt" \
  --check --tag smoke >"$OUT"
cat "$OUT"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
grep -q "check: the loaded master weights equal the saved ones" "$OUT" || fail "no check line"
for phase in save load; do
  for rank in 0 1; do
    line=$(grep "\"phase\": \"$phase\"" "$OUT" | grep "\"rank\": $rank," || true)
    [ -n "$line" ] || fail "no $phase line of rank $rank"
    fraction=$(sed -E 's/.*"host_fraction": ([0-9.]+).*/\1/' <<<"$line")
    gbps=$(sed -E 's/.*"gb_per_s": ([0-9.]+).*/\1/' <<<"$line")
    if [ "$phase" = save ]; then
      awk -v f="$fraction" 'BEGIN { exit !(f > 0 && f < 1) }' ||
        fail "save rank $rank held $fraction of the state at once"
    else
      awk -v f="$fraction" 'BEGIN { exit !(f > 0 && f < 0.4) }' ||
        fail "load rank $rank held $fraction of the state at once, not one unit's slices"
    fi
    awk -v g="$gbps" 'BEGIN { exit !(g > 0) }' || fail "$phase rank $rank: $gbps GB/s"
  done
done
[ -z "$(ls -A "$TEST_TMPDIR/ckpt")" ] || fail "the checkpoint was not removed"
echo PASS
