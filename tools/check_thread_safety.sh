#!/bin/bash
# The lock annotations hold: clang's thread-safety analysis (-Wthread-safety) over every source
# of server/ and over the worker's client of the daemon (worker/daemon_client.cc), as errors.
# Their shared state is declared with Abseil's annotations (ABSL_GUARDED_BY(mu_) on a member,
# ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) on a ...Locked method) and guarded by engine/core/mutex.h's
# Mutex, which clang knows as a capability; gcc, which builds them, ignores them, so this check
# is where they are enforced. First it proves the check can fail: a probe that reads a guarded
# member without its lock must be refused.
# Run by tools/test.sh (one test, "thread-safety"); by hand: `bash tools/check_thread_safety.sh`.
set -uo pipefail
cd "$(dirname "$0")/.."
bazel() { command bazel ${ITHACA_OUTPUT_BASE:+--output_base="$ITHACA_OUTPUT_BASE"} "$@"; }

# The generated protocol headers the daemon includes.
bazel build --noshow_progress //proto:ithaca_cc_grpc >/dev/null 2>&1 ||
  { echo "thread-safety: FAILED (cannot build //proto:ithaca_cc_grpc)"; exit 1; }
bin=$(bazel info bazel-bin 2>/dev/null)
flags=(-std=c++17 -fsyntax-only -Wthread-safety -Werror=thread-safety -Wno-unknown-warning-option
       -iquote . -iquote "$bin" -isystem proto -isystem "$bin/proto")

probe=$(mktemp --suffix=.cc)
trap 'rm -f "$probe"' EXIT
cat >"$probe" <<'CC'
#include "engine/core/mutex.h"
class Counter {
 public:
  int Locked() {
    ithaca::MutexLock lock(&mu_);
    return n_;
  }
  int Unlocked() { return n_; }  // reads n_ without mu_: must be refused
 private:
  ithaca::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};
CC
if clang++ "${flags[@]}" "$probe" >/dev/null 2>&1; then
  echo "thread-safety: FAILED (the probe that reads a guarded member unlocked was accepted)"
  exit 1
fi

failures=0
for f in $(git ls-files 'server/*.cc' | grep -v '_test\.cc$') worker/daemon_client.cc; do
  if ! out=$(clang++ "${flags[@]}" "$f" 2>&1); then
    echo "thread-safety: FAIL $f"
    grep -E "error|warning" <<<"$out" | head -20 | sed 's/^/  /'
    failures=$((failures + 1))
  fi
done
if [ $failures -ne 0 ]; then
  echo "thread-safety: FAILED ($failures files)"
  exit 1
fi
echo "thread-safety: PASSED"
