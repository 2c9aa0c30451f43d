#!/bin/bash
# Bazel sh_test wrapper: runs safetensors_interop.py under the project's .venv Python, which has
# Debian's numpy and torch and the PyPI safetensors package (the pyenv python3 on PATH has none).
# Arguments: <safetensors_tool> <safetensors_interop.py>.
set -euo pipefail
# The project's .venv (tools/setup.sh), found through this script's link back into the source
# tree (Bazel's runfiles are links); ITHACA_PYTHON overrides it.
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
exec "$PY" "$2" "$1"
