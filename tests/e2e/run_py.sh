#!/bin/bash
# Runs one end-to-end test script with Debian's /usr/bin/python3 (the interpreter tools/setup.sh
# gives grpcio, grpcio-tools and prometheus-client; the python3 first on PATH may lack them).
# Python stubs for the API are generated here with grpcio-tools' bundled protoc.
set -euo pipefail
script="$1"
shift
gen="${TEST_TMPDIR:-$(mktemp -d)}/pygen"
mkdir -p "$gen"
/usr/bin/python3 -m grpc_tools.protoc -Iproto --python_out="$gen" --grpc_python_out="$gen" \
  proto/ithaca/v1/job.proto
# The health proto goes in as a top-level module: a generated "grpc" package would shadow grpcio.
/usr/bin/python3 -m grpc_tools.protoc -Iproto/grpc/health/v1 --python_out="$gen" \
  --grpc_python_out="$gen" proto/grpc/health/v1/health.proto
export ITHACAD="$PWD/server/ithacad" ITHACA_WORKER="$PWD/worker/ithaca-worker"
export ITHACA_CLI="$PWD/client/ithaca" ITHACA_TOKENIZE="$PWD/engine/train/ithaca-tokenize"
export ITHACA_CORPUS="$PWD/engine/train/testdata/tiny_corpus.txt"
export PYTHONPATH="$gen:$PWD/tests/e2e"
exec /usr/bin/python3 -u "$script" "$@"
