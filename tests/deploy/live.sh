#!/bin/bash
# Runs prometheus_live_test.py the way the end-to-end tests run: through tests/e2e/run_py.sh
# (ithaca_client built from the tree, paths of the built binaries) with tests/e2e/harness.py.
set -euo pipefail
e2e="tests/e2e"
export ITHACA_E2E_DIR="$e2e"
exec bash "$e2e/run_py.sh" tests/deploy/prometheus_live_test.py
