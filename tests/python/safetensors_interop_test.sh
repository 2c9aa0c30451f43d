#!/bin/bash
# Bazel sh_test wrapper: runs safetensors_interop.py under /usr/bin/python3, the interpreter with
# numpy, torch and the PyPI safetensors package (the pyenv python3 on PATH has none of them).
# Arguments: <safetensors_tool> <safetensors_interop.py>.
set -euo pipefail
exec /usr/bin/python3 "$2" "$1"
