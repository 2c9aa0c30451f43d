#!/bin/bash
# host_adamw_bench at a small size: one JSON line per thread count, with both measurements.
set -euo pipefail
out=$("$1" --params=1048576 --copy_gib=0.01 --reps=1 --threads=1,2)
echo "$out"
[ "$(echo "$out" | wc -l)" -eq 2 ] || { echo "want 2 lines"; exit 1; }
for key in '"bench": "host_adamw"' '"params_per_s": ' '"copy_gb_per_s": ' '"fraction_of_bound": '; do
  echo "$out" | grep -q "$key" || { echo "missing $key"; exit 1; }
done
echo "$out" | python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]'
