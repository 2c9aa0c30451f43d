#!/bin/bash
# The daemon's and the engine's CPU tests under AddressSanitizer and UndefinedBehaviorSanitizer
# (`--config=asan` in .bazelrc: its own output directory, so the plain build stays cached).
# Not yet part of tools/test.sh: a cold build under the sanitizers doubles CI's time. Tests that
# bound time or memory, or plan hundreds of times, are left out (tag sanitizer_bounds: the
# sanitizers make them slower and larger, not wrong). Last run (2026-12-04): 58 of //server:all
# and //engine/... passed, no ASan or UBSan report.
# Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."
# (The one admission test whose fit suggestion is bounded to 3 s of planning is left out too.)
exec bazel test --config=asan --test_tag_filters=-gpu,-sanitizer_bounds \
  --test_env=GTEST_FILTER=-AdmissionTest.OptimizerOffloadOverTheHostBudgetIsRefusedNamingTheTier \
  //server:all //engine/... "$@"
