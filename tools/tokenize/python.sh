#!/bin/bash
# The Python that has `tokenizers` and `pyarrow`: $ITHACA_PYTHON when set, else the repository's
# .venv (tools/setup.sh), else /usr/bin/python3. Resolves symlinks first, so it finds the
# repository from Bazel's runfiles too.
repo="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)"
for py in "${ITHACA_PYTHON:-}" "$repo/.venv/bin/python" /usr/bin/python3; do
  [ -n "$py" ] && [ -x "$py" ] && exec "$py" "$@"
done
echo "python.sh: no Python found (set ITHACA_PYTHON or run tools/setup.sh)" >&2
exit 1
