#!/bin/bash
# Checks that the documentation points at files that exist: every relative Markdown link
# ([text](path), anchors dropped) and every `path` in backticks that starts with a top-level
# folder of the repository (bench/, docs/, engine/, lab/, ...) in README.md, docs/*.md,
# lab/README.md and bench/results/INDEX.md. A backticked path with a file extension must exist;
# one without (a binary or a Bazel target's name, e.g. `bench/checkpoint_bench`) needs its folder.
# Prints each broken reference as FILE:LINE: PATH and exits 1 if there is one.
#
# tools/check_links.sh [REPO_ROOT]; without it the repository above this script (under Bazel:
# the source tree that the runfiles' README.md links to, so that the whole tree is checked).
set -euo pipefail
root="${1:-}"
if [ -z "$root" ]; then
  if [ -n "${TEST_SRCDIR:-}" ] && [ -e "$TEST_SRCDIR/${TEST_WORKSPACE:-ithaca}/README.md" ]; then
    root="$(dirname "$(readlink -f "$TEST_SRCDIR/${TEST_WORKSPACE:-ithaca}/README.md")")"
  else
    root="$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)"
  fi
fi
cd "$root"
exec python3 - <<'EOF'
import glob, os, re, sys

TOP = ("bazel/", "bench/", "client/", "deploy/", "docs/", "engine/", "fuzz/", "lab/", "proto/",
       "server/", "tests/", "third_party/", "tools/", "worker/")
files = ["README.md"] + sorted(glob.glob("docs/*.md")) + ["lab/README.md", "bench/results/INDEX.md"]
link = re.compile(r"\]\(([^)\s]+)\)")
code = re.compile(r"`([^`\s]+)`")
broken = 0
for f in files:
    if not os.path.exists(f):
        print(f"{f}: missing (tools/check_links.sh reads it)")
        broken += 1
        continue
    fence = False
    for n, line in enumerate(open(f, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        for target in link.findall(line):
            path = target.split("#", 1)[0]
            if not path or re.match(r"^[a-z]+:", target):
                continue  # an anchor on the same page, or a URL
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(f), path))):
                print(f"{f}:{n}: {target}")
                broken += 1
        if fence:
            continue
        for path in code.findall(line):
            if (not path.startswith(TOP) or re.search(r"[*…<>{}$|,:;=()\[\]]|\.\.\.", path)
                    or re.search(r"DATE|MODEL", path)):
                continue  # not a path, or a pattern, a placeholder or a Bazel label
            path = path.rstrip("/")
            ok = os.path.exists(path) or (
                "." not in os.path.basename(path) and os.path.isdir(os.path.dirname(path)))
            if not ok:
                print(f"{f}:{n}: `{path}`")
                broken += 1
print(f"{broken} broken reference(s) in {len(files)} files" if broken else
      f"every link and path in {len(files)} files exists")
sys.exit(1 if broken else 0)
EOF
