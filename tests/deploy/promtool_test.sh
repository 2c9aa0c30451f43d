#!/bin/bash
# promtool (Debian's prometheus package): the scrape config and rule files are valid, and the
# rules behave as tests/deploy/rules_test.yml says on synthetic series.
set -euo pipefail
# The project's .venv (tools/setup.sh), found through this script's link back into the source
# tree (Bazel's runfiles are links); ITHACA_PYTHON overrides it.
PY="${ITHACA_PYTHON:-$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)/.venv/bin/python}"
promtool --version | head -1
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/*.rules.yml
# The Kubernetes copy of the rules: its spec is a rule file's content.
"$PY" -c 'import sys, yaml; yaml.safe_dump(yaml.safe_load(open(sys.argv[1]))["spec"], open(sys.argv[2], "w"))' \
  deploy/kubernetes/prometheusrule.yaml "${TEST_TMPDIR}/prometheusrule-spec.yml"
promtool check rules "${TEST_TMPDIR}/prometheusrule-spec.yml"
cd tests/deploy
promtool test rules rules_test.yml
