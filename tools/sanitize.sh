#!/bin/bash
# The CPU tests under the sanitizers, each configuration in an output directory of its own
# (.bazelrc), so the plain build stays cached:
#   tools/sanitize.sh asan   the daemon's, the launch layer's and the engine's CPU tests under
#                            AddressSanitizer and UndefinedBehaviorSanitizer (--config=asan)
#   tools/sanitize.sh tsan   the daemon's tests and the worker's daemon client's under
#                            ThreadSanitizer (--config=tsan): both are multi-threaded
#                            (tools/tsan.supp: what is not ours)
# tools/test.sh runs both (one test each; ITHACA_SANITIZE=0 leaves them out). Tests that bound
# time or memory, or plan hundreds of times, are left out (tag sanitizer_bounds: the sanitizers
# make them slower and larger, not wrong), as is the one admission test whose fit suggestion is
# bounded to 3 s of planning. Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."
bazel() { command bazel ${ITHACA_OUTPUT_BASE:+--output_base="$ITHACA_OUTPUT_BASE"} "$@"; }
mode=${1:-asan}
shift || true
common=(--test_tag_filters=-gpu,-sanitizer_bounds
        --test_env=GTEST_FILTER=-AdmissionTest.OptimizerOffloadOverTheHostBudgetIsRefusedNamingTheTier)
case "$mode" in
  asan) bazel test --config=asan "${common[@]}" //server:all //launch:all //engine/... "$@" ;;
  tsan) bazel test --config=tsan "${common[@]}" //server:all //worker:daemon_client_test \
         --test_env=TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0:suppressions=$PWD/tools/tsan.supp \
         "$@" ;;
  *) echo "usage: tools/sanitize.sh asan|tsan [bazel test args]" >&2; exit 2 ;;
esac
