#!/bin/bash
# Runs one Python test script with the project's .venv Python (tools/setup.sh gives it grpcio,
# grpcio-tools and prometheus-client; the python3 first on PATH may lack them).
# ithaca_client is built here from this tree (client/python, its gRPC modules generated from
# proto/ by client/python/protogen.py), so a test runs the client and the API it was built with,
# not whatever copy tools/setup.sh installed into .venv.
set -euo pipefail
# The project's .venv (tools/setup.sh), found through this script's link back into the source
# tree (Bazel's runfiles are links); ITHACA_PYTHON overrides it.
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
script="$1"
shift
gen="${TEST_TMPDIR:-$(mktemp -d)}/pygen"
rm -rf "$gen"
mkdir -p "$gen"
cp -rL client/python/ithaca_client "$gen/ithaca_client"
"$PY" client/python/protogen.py proto "$gen/ithaca_client/_generated"
export ITHACAD="$PWD/server/ithacad" ITHACA_WORKER="$PWD/worker/ithaca-worker"
export ITHACA_CLI="$PWD/client/ithaca" ITHACA_TOKENIZE="$PWD/engine/data/ithaca-tokenize"
export ITHACA_CORPUS="$PWD/engine/data/testdata/tiny_corpus.txt"
export PYTHONPATH="$gen:$PWD/tests/e2e"
exec "$PY" -u "$script" "$@"
