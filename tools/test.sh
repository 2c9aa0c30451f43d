#!/bin/bash
# Builds everything and runs every test offline; ends with a plain "N passed, N failed" line
# (Bazel's own summary is not a format CI reads). Extra arguments go to `bazel test`.
set -o pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
bazel test //... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
passed=$(grep -cE '^//.* PASSED in ' "$log")
failed=$(grep -cE '^//.* (FAILED|TIMEOUT|INCOMPLETE|NO STATUS|FAILED TO BUILD)( in |$)' "$log")
bazel shutdown >/dev/null 2>&1  # do not leave the JVM server running
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi  # a build failure
rm -f "$log"
echo "${passed} passed, ${failed} failed"
exit $rc
