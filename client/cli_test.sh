#!/bin/bash
# The ithaca command line as a user meets it, no daemon needed: --version, per-command help,
# usage errors (exit 2, naming the command and its help), and `completion bash` loaded into
# bash and asked for completions the way bash asks.
set -euo pipefail
ITHACA="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$ITHACA" --version)
[[ $out =~ ^ithaca\ [0-9]+\.[0-9]+\.[0-9]+ ]] || fail "--version printed: $out"

help=$("$ITHACA" --help)
for cmd in submit watch wait status list logs report cancel delete plan node completion; do
  grep -q "^  $cmd" <<<"$help" || fail "--help does not list $cmd: $help"
done
"$ITHACA" cancel --help | grep -q -- "--reason" || fail "cancel --help lacks --reason"
"$ITHACA" submit --help | grep -q -- "-f,--filename" || fail "submit --help lacks -f"

# Usage errors: exit 2, the command named, where to look.
expect_usage() {
  local want="$1"; shift
  set +e
  err=$("$ITHACA" --server 127.0.0.1:1 "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "ithaca $*: exit $rc, expected 2 ($err)"
  grep -q -- "$want" <<<"$err" || fail "ithaca $*: '$err' lacks '$want'"
  grep -q "ithaca --help" <<<"$err" || fail "ithaca $*: '$err' does not point at --help"
}
expect_usage "status: The following argument was not expected: -f" status job-1 -f
expect_usage "cancel: .*--rank" cancel job-1 --rank 0
expect_usage "unknown command \"frobnicate\"" frobnicate
expect_usage "unknown command \"sumbit\"; did you mean submit?" sumbit job.toml
expect_usage "drain: --timeout: Value 0.5 not in range" drain --timeout 0.5
expect_usage "drain: --timeout: Value 1e12 not in range" drain --timeout 1e12
expect_usage "drain: --timeout: .*whole seconds" drain --timeout 2.5
# A spec that cannot be read says why (exit 2).
for args in "submit no-such-spec.toml|cannot read: No such file or directory" \
            "plan /|/: is a directory, not a job spec"; do
  set +e
  err=$("$ITHACA" --server 127.0.0.1:1 ${args%%|*} 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "ithaca ${args%%|*}: exit $rc, expected 2 ($err)"
  grep -q -- "${args#*|}" <<<"$err" || fail "ithaca ${args%%|*}: '$err' lacks '${args#*|}'"
done
expect_usage "unknown command \"frobnicate\"" --server x:1 -o json frobnicate
expect_usage "status: id is required" status
expect_usage "node: -o name is not supported" -o name node
expect_usage "logs: --follow excludes --steps" logs job-1 --steps -f
expect_usage "submit: a spec is needed" submit
expect_usage "--output: .*not in" -o yaml list
expect_usage "plan: --multiple-of requires --max-seq-len" plan job.toml --multiple-of 512

# A command that needs the daemon, with none there: exit 2 and the hint.
set +e
err=$("$ITHACA" --server 127.0.0.1:1 status job-1 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "status with no daemon: exit $rc"
grep -q "is ithacad running" <<<"$err" || fail "status with no daemon: $err"

# Completion: bash loads the script, and asking as bash does gives the words.
script=$("$ITHACA" completion bash)
bash -n <<<"$script" || fail "completion bash is not valid bash"
complete_words() {  # the words bash would offer for the command line "$@" (last word: partial)
  bash -c '
    eval "$1"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
    _ithaca
    printf "%s\n" "${COMPREPLY[@]}"' _ "$script" "$@"
}
words=$(complete_words ithaca "")
for cmd in submit wait cancel completion; do
  grep -qx "$cmd" <<<"$words" || fail "completing 'ithaca ': no $cmd in: $words"
done
grep -qx "wait" <<<"$(complete_words ithaca wa)" || fail "completing 'ithaca wa'"
words=$(complete_words ithaca cancel --r)
grep -qx -- "--reason" <<<"$words" || fail "completing 'ithaca cancel --r': $words"
words=$(complete_words ithaca -o "")
[ "$(sort <<<"$words" | tr '\n' ' ')" = "json name wide " ] || fail "completing -o: $words"
words=$(complete_words ithaca list --state s)
[ "$(sort <<<"$words" | tr '\n' ' ')" = "starting succeeded " ] || fail "--state s: $words"
words=$(complete_words ithaca --server x:1 logs job-1 --)
grep -qx -- "--steps" <<<"$words" || fail "completing logs flags after a global flag: $words"
grep -qx "bash" <<<"$(complete_words ithaca completion "")" || fail "completing 'completion'"
words=$(complete_words ithaca submit job.toml --af)
grep -qx -- "--after" <<<"$words" || fail "completing 'ithaca submit --af': $words"
# A flag takes no value: the word after it is the command.
words=$(complete_words ithaca --json cancel --r)
grep -qx -- "--reason" <<<"$words" || fail "completing after --json: $words"

echo "PASS"
