#!/bin/bash
# Runs a test script with the project's .venv Python: tools/setup.sh gives it kubernetes-validate
# and Debian's python3-yaml (the python3 first on PATH may lack them).
# The project's .venv (tools/setup.sh), found through this script's link back into the source
# tree (Bazel's runfiles are links); ITHACA_PYTHON overrides it.
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
exec "$PY" -u "$@"
