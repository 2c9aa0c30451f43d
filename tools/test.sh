#!/bin/bash
# Builds everything and runs every test offline; ends with a plain "N passed, N failed" line
# (Bazel's own summary is not a format CI reads). Extra arguments go to `bazel test`.
#
# Then tools/check_layers.sh proves the layers hold (one test, "layers"), tools/check_format.sh
# that the C++ is as .clang-format writes it (one test, "format"), tools/check_thread_safety.sh
# that the daemon's locks are held where its annotations say (one test), tools/sanitize.sh runs
# the CPU tests under ASan + UBSan and the daemon's under TSan (one test each), and every fuzzer
# of tools/fuzz.sh runs 30 s (ITHACA_FUZZ_SECONDS), one test each.
#
# GPU tests (tagged `gpu`) run only where a GPU exists (`nvidia-smi -L` succeeds); elsewhere they
# are still built but not run, and so not counted as passed. The line before the last names the
# GPU tests that did not run: "N skipped (no GPU): //a //b ..." (or "(built without CUDA)" when
# the build found no CUDA, bazel/cuda_configure.bzl, and left them out), then the cases a passing
# test skipped itself (GTEST_SKIP, unittest's skipTest), each counted as one skipped:
# "//t:Suite.Case" (gtest) or "//t(unittest:N)" (unittest names none in its summary).
#
# Each phase prints its wall time as it ends ("time: sanitize asan 512 s"), and one line before
# the skipped line sums them up ("times: test 840 s, layers 45 s, ..., total 1620 s"). The
# fuzzers run beside the checks and the sanitizers (their time is fixed, the others' is CPU), and
# their lines are printed once they are done.
set -o pipefail
cd "$(dirname "$0")/.."
# ITHACA_OUTPUT_BASE: a Bazel output base of its own (tools/ci_no_cuda.sh keeps its build apart).
bazel() { command bazel ${ITHACA_OUTPUT_BASE:+--output_base="$ITHACA_OUTPUT_BASE"} "$@"; }
log=$(mktemp)
# Phase timing: `phase_done NAME` prints how long NAME took since the last phase ended (or since
# `phase_start=$SECONDS`) and keeps it for the summary.
times=()
start_all=$SECONDS
phase_start=$SECONDS
phase_done() {
  local took=$((SECONDS - phase_start))
  echo "time: $1 ${took} s"
  times+=("$1 ${took} s")
  phase_start=$SECONDS
}
# A GPU test is a `gpu`-tagged test; without CUDA it is a `gpu`-tagged placeholder (a filegroup).
# The query names the repository's packages rather than //..., which would also walk into the
# bazel-* links of another output base (tools/ci_no_cuda.sh keeps its own).
packages=$(git ls-files -- BUILD '*/BUILD' 2>/dev/null | grep -v '^third_party/bazel_stubs/' \
  | sed -e 's|/\?BUILD$||' -e 's|^|//|' -e 's|$|:all|' | paste -sd+)
packages=${packages:-//...}
gpu_targets=$(bazel query --noshow_progress "attr(tags, '\bgpu\b', $packages)" 2>>"$log" | sort)
left_out=$(bazel query --noshow_progress "attr(tags, '\bbuilt_without_cuda\b', $packages)" \
  2>>"$log" | sort)
if nvidia-smi -L >/dev/null 2>&1; then
  skipped=$left_out
  reason="built without CUDA"
  bazel test //... "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
else
  skipped=$gpu_targets
  reason=$([ -n "$left_out" ] && echo "no GPU; built without CUDA" || echo "no GPU")
  bazel test //... --test_tag_filters=-gpu "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
fi
phase_done "build and test"
passed=$(grep -cE '^//.* PASSED in ' "$log")
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|INCOMPLETE|NO STATUS|FAILED TO BUILD)( in |$)' "$log")
# The cases that passing tests skipped, from their logs: gtest's "[  SKIPPED ] Suite.Case" and
# unittest's "OK (skipped=N)".
testlogs=$(bazel info bazel-testlogs 2>>"$log")
skipped_cases=()
n_skipped_cases=0
for target in $(grep -E '^//.* PASSED in ' "$log" | awk '{print $1}'); do
  f="$testlogs/$(sed -e 's|^//||' -e 's|:|/|' <<<"$target")/test.log"
  [ -f "$f" ] || continue
  for c in $(grep -oE '^\[  SKIPPED \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/]+' "$f" | awk '{print $4}' | sort -u); do
    skipped_cases+=("$target:$c")
    n_skipped_cases=$((n_skipped_cases + 1))
  done
  n=$(grep -oE '^OK \(skipped=[0-9]+\)' "$f" | tail -1 | grep -oE '[0-9]+')
  if [ -n "$n" ]; then
    skipped_cases+=("$target(unittest:$n)")
    n_skipped_cases=$((n_skipped_cases + n))
  fi
done
# The parsers of untrusted input are fuzzed ITHACA_FUZZ_SECONDS each (default 30; 0: not at all),
# under ASan and UBSan (tools/fuzz.sh), in the background while the checks and the sanitizers
# below run; each fuzzer counts as one test.
fuzz_seconds=${ITHACA_FUZZ_SECONDS:-30}
if [ "$fuzz_seconds" != 0 ]; then
  fuzz_log=$(mktemp)
  fuzz_begun=$SECONDS
  # A fixed seed and a fresh corpus: the same inputs on every CI run (tools/fuzz.sh by hand,
  # without FUZZ_SEED, explores anew each time).
  FUZZ_SEED=${ITHACA_FUZZ_SEED:-20261201} FUZZ_OUT=$(mktemp -d) \
    bash tools/fuzz.sh -t "$fuzz_seconds" >"$fuzz_log" 2>&1 &
  fuzz_pid=$!
fi
# The layers (//:BUILD's package groups): wrong-layer dependencies fail the build. One test.
if bash tools/check_layers.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); rc=1; fi
phase_done layers
# The C++ and CUDA files as .clang-format writes them. One test.
if bash tools/check_format.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); rc=1; fi
phase_done format
# The lock annotations, proved by clang's thread-safety analysis. One test.
if bash tools/check_thread_safety.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); rc=1; fi
phase_done thread-safety
# The CPU tests again under the sanitizers (tools/sanitize.sh): the daemon's, the launch layer's
# and the engine's under ASan + UBSan, the daemon's under TSan. One test each; ITHACA_SANITIZE=0
# leaves them out.
if [ "${ITHACA_SANITIZE:-1}" != 0 ]; then
  for mode in asan tsan; do
    sanitize_log=$(mktemp)
    if bash tools/sanitize.sh "$mode" >"$sanitize_log" 2>&1; then
      echo "sanitize $mode: PASSED ($(grep -cE '^//.* PASSED in ' "$sanitize_log") targets)"
      passed=$((passed + 1))
    else
      echo "sanitize $mode: FAILED"
      grep -E '^//.* (FAILED|TIMEOUT|NO STATUS)|ERROR|SUMMARY: ' "$sanitize_log" | head -30
      failed=$((failed + 1))
      rc=1
    fi
    rm -f "$sanitize_log"
    phase_done "sanitize $mode"
  done
fi
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # a build failure
if [ -n "${fuzz_pid:-}" ]; then
  wait "$fuzz_pid"
  fuzz_rc=$?
  cat "$fuzz_log"
  [ "$fuzz_rc" -eq 0 ] || rc=1
  fuzz_passed=$(grep -cE '^fuzz: .* PASSED in ' "$fuzz_log")
  fuzz_failed=$(grep -cE '^fuzz: .* FAILED' "$fuzz_log")
  # A fuzz.sh that failed before naming any fuzzer (no clang++, no absl) is one failure.
  if [ "$fuzz_rc" -ne 0 ] && [ "$fuzz_passed" -eq 0 ] && [ "$fuzz_failed" -eq 0 ]; then
    fuzz_failed=1
  fi
  passed=$((passed + fuzz_passed))
  failed=$((failed + fuzz_failed))
  rm -f "$fuzz_log"
  # The fuzzers' own wall time, from their start: it overlaps the phases above.
  echo "time: fuzz $((SECONDS - fuzz_begun)) s (beside the checks and sanitizers)"
  times+=("fuzz $((SECONDS - fuzz_begun)) s (beside)")
  phase_done "waiting for the fuzzers"
fi
bazel shutdown >/dev/null 2>&1  # do not leave the JVM server running
rm -f "$log"
n_skipped=$(grep -c . <<<"$skipped")
echo "times: $(printf '%s, ' "${times[@]}")total $((SECONDS - start_all)) s"
echo "$((n_skipped + n_skipped_cases)) skipped (${reason}):" $skipped \
  ${skipped_cases[@]+"; skipped by the test itself:" "${skipped_cases[@]}"}
echo "${passed} passed, ${failed} failed"
exit $rc
