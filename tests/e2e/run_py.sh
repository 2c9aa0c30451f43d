#!/bin/bash
# Runs one end-to-end test script with the project's .venv Python (tools/setup.sh gives it
# grpcio, grpcio-tools and prometheus-client; the python3 first on PATH may lack them).
# Python stubs for the API are generated here with grpcio-tools' bundled protoc.
set -euo pipefail
# The project's .venv (tools/setup.sh), found through this script's link back into the source
# tree (Bazel's runfiles are links); ITHACA_PYTHON overrides it.
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
script="$1"
shift
gen="${TEST_TMPDIR:-$(mktemp -d)}/pygen"
mkdir -p "$gen"
"$PY" -m grpc_tools.protoc -Iproto --python_out="$gen" --grpc_python_out="$gen" \
  proto/ithaca/v1/job.proto
# The health proto goes in as a top-level module: a generated "grpc" package would shadow grpcio.
"$PY" -m grpc_tools.protoc -Iproto/grpc/health/v1 --python_out="$gen" \
  --grpc_python_out="$gen" proto/grpc/health/v1/health.proto
export ITHACAD="$PWD/server/ithacad" ITHACA_WORKER="$PWD/worker/ithaca-worker"
export ITHACA_CLI="$PWD/client/ithaca" ITHACA_TOKENIZE="$PWD/engine/train/ithaca-tokenize"
export ITHACA_CORPUS="$PWD/engine/train/testdata/tiny_corpus.txt"
export PYTHONPATH="$gen:$PWD/tests/e2e"
exec "$PY" -u "$script" "$@"
