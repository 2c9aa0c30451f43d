#!/bin/bash
# docs/spec.md must be what the key table generates; else regenerate it:
#   bazel run //engine/spec:spec_reference > docs/spec.md
set -euo pipefail
if ! diff <("$1") "$2" >/tmp/spec_reference.diff 2>&1; then
  echo "docs/spec.md is stale; regenerate it with: bazel run //engine/spec:spec_reference > docs/spec.md"
  head -40 /tmp/spec_reference.diff
  exit 1
fi
echo "docs/spec.md matches the key table"
