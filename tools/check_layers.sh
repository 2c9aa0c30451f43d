#!/bin/bash
# Proves that the layers of //:BUILD hold: a dependency that points up a layer (or from the
# client into the engine) fails `bazel build`, and one that points down passes.
#
# For each case it writes a throwaway package at the lower layer's place in the tree
# (engine/backend/_layer_probe/BUILD, ...), holding one library that depends on the target
# named, and asks Bazel to analyse it (`bazel build --nobuild`): a wrong arrow must fail with
# "is not visible from", a right one must pass. The probes are removed on exit. Run by
# tools/test.sh (one test, "layers"); by hand: `bash tools/check_layers.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
bazel() { command bazel ${ITHACA_OUTPUT_BASE:+--output_base="$ITHACA_OUTPUT_BASE"} "$@"; }

probes=()
cleanup() { for d in "${probes[@]}"; do rm -rf "$d"; done; }
trap cleanup EXIT

failures=0
# probe PACKAGE DEP want(pass|fail): PACKAGE/_layer_probe:probe depends on DEP.
probe() {
  local dir="$1/_layer_probe" dep="$2" want="$3" out rc
  mkdir -p "$dir"
  probes+=("$dir")
  printf 'cc_library(\n    name = "probe",\n    deps = ["%s"],\n)\n' "$dep" >"$dir/BUILD"
  out=$(bazel build --nobuild --noshow_progress "//$dir:probe" 2>&1)
  rc=$?
  if [ "$want" = pass ] && [ $rc -eq 0 ]; then
    echo "layers: ok   //$1 -> $dep (allowed)"
  elif [ "$want" = fail ] && [ $rc -ne 0 ] && grep -q "is not visible from" <<<"$out"; then
    echo "layers: ok   //$1 -> $dep (refused: not visible)"
  else
    echo "layers: FAIL //$1 -> $dep: wanted $want, bazel exited $rc"
    grep -E "ERROR" <<<"$out" | head -5 | sed 's/^/  /'
    failures=$((failures + 1))
  fi
  rm -rf "$dir"
}

# Arrows that point down (or sideways within a layer), as the code uses them.
probe engine/core //third_party:absl pass
probe engine/memory //engine/core pass
probe engine/backend //engine/memory pass
probe engine/model //engine/backend:ops pass
probe engine/parallel //engine/spec:validate pass
probe engine/schedule //engine/parallel pass
probe engine/plan //engine/train:optimizer pass
probe engine/train //engine/checkpoint:distributed_checkpoint pass
probe engine/plan //engine/schedule:llama pass
probe engine/runtime //engine/train:trainer pass
probe worker //engine/runtime:rank pass
probe launch //engine/comm:rendezvous pass
probe server //launch:launcher pass
probe worker //launch:launcher pass
probe worker //daemon_link:connection pass
probe client //proto:ithaca_cc_grpc pass
probe client //daemon_link:connection pass
probe client //launch:layout pass
probe tests //server:daemon pass

# Arrows that point up, one per layer boundary, sideways between the daemon and the worker, and
# the client into the engine or past the daemon link.
probe engine/core //engine/memory fail
probe engine/comm //engine/backend:ops fail
probe engine/backend //engine/model:params fail
probe engine/backend //engine/train:trainer fail
probe engine/model //engine/parallel fail
probe engine/parallel //engine/schedule:llama fail
probe engine/schedule //engine/plan:planner fail
probe engine/data //engine/runtime:rank fail
probe engine/checkpoint //engine/train:trainer fail
probe engine/checkpoint //engine/train:optimizer fail
probe engine/runtime //launch:launcher fail
probe launch //worker:daemon_mode fail
probe launch //server:daemon fail
probe server //worker:daemon_mode fail
probe server //worker:local_launch fail
probe worker //server:daemon fail
probe worker //client:format fail
probe client //launch:launcher fail
probe daemon_link //launch:launcher fail
probe daemon_link //engine/core fail
probe engine/spec //engine/plan:planner fail
probe engine/spec //engine/model:params fail
probe client //engine/core fail
probe client //engine/spec:toml_text fail
probe proto //engine/train:trainer fail

if [ $failures -ne 0 ]; then
  echo "layers: FAILED ($failures wrong)"
  exit 1
fi
echo "layers: PASSED"
