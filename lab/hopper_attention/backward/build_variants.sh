#!/usr/bin/env bash
# Builds the default library and the variants the next device session compares, into build/:
#   libhopper_bwd.so          default (bulk-reduce dQ, descending query tiles, KV-head-major CTAs)
#   libhopper_bwd_atomic.so   -DITHACA_BWD_DQ_ATOMIC=1 (float4 atomics for dQ, no writer warp)
#   libhopper_bwd_masc.so     -DITHACA_BWD_M_DESC=0 (query tiles ascending from the diagonal, FA3)
#   libhopper_bwd_tile.so     -DITHACA_BWD_CTA_ORDER=1 (KV-tile-major CTA order)
#   libhopper_bwd_p32.so      -DITHACA_BWD_PRODUCER_REGS=32
#   libhopper_bwd_dvfirst.so  -DITHACA_BWD_DV_FIRST=1 (dV issued before dS is computed)
# bench_bwd.py runs a variant as impl "ours:<name>" (e.g. ours:atomic). Logs: build/*.log.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
# The -D switches live in the engine's kernel only up to commit c34505a (issue 29 removed them
# once measured): without them every variant would silently be the default.
if ! grep -q 'ITHACA_BWD_' "$ROOT/engine/backend/cuda/hopper_attention_bwd.cu"; then
  echo "build_variants.sh: engine/backend/cuda/hopper_attention_bwd.cu has no ITHACA_BWD_* switches;" \
    "build the variants from the last kernel that had them:" \
    "git worktree add /tmp/bwd-variants c34505a && /tmp/bwd-variants/bench/hopper_attention/backward/build_variants.sh" >&2
  exit 1
fi
mkdir -p "$HERE/build"
build() {  # name, flags...
  local name="$1"; shift
  local out="$HERE/build/libhopper_bwd${name:+_$name}.so"
  LIB_OUT="$out" "$HERE/build.sh" "$@" > "$HERE/build/build${name:+_$name}.log" 2>&1 \
    || { echo "build ${name:-default} FAILED (see build/build${name:+_$name}.log)"; return 1; }
  echo "${name:-default}: $(grep -A2 attn_bwd_kernel "$HERE/build/build${name:+_$name}.log" | grep -E 'spill|Used' | tr -s ' ' | paste -sd' ')"
}
build ""
build atomic -DITHACA_BWD_DQ_ATOMIC=1
build masc -DITHACA_BWD_M_DESC=0
build tile -DITHACA_BWD_CTA_ORDER=1
build p32 -DITHACA_BWD_PRODUCER_REGS=32
build dvfirst -DITHACA_BWD_DV_FIRST=1
