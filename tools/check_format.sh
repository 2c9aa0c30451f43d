#!/bin/bash
# The project's C++ and CUDA files as .clang-format writes them (Google style, 100 columns,
# includes in the order written). One test in tools/test.sh ("format"). To fix what it names:
#   clang-format -i FILE...      (Debian's clang-format 14, tools/setup.sh installs it)
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "format: FAILED: clang-format is not installed (bash tools/setup.sh)"
  exit 1
fi
bad=()
while IFS= read -r f; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh' | grep -v '^third_party/')
if [ ${#bad[@]} -ne 0 ]; then
  echo "format: FAILED: ${#bad[@]} files differ from .clang-format: clang-format -i ${bad[*]}"
  exit 1
fi
echo "format: PASSED"
