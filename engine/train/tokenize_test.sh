#!/bin/bash
# ithaca-tokenize end to end: token counts in the output and in the file header, file size, and a
# clear error for a missing input. Args: the tokenizer binary, the demo corpus.
set -u
tokenize="$1"
corpus="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

# The header's uint64 count (offset 16) and the file size must agree with the expected count.
check_file() {
  local file="$1" want="$2"
  local count size
  count=$(od -An -t u8 -j 16 -N 8 "$file" | tr -d ' ')
  size=$(stat -c %s "$file")
  [ "$count" = "$want" ] || fail "$file: header count $count, want $want"
  [ "$size" = $((32 + 4 * want)) ] || fail "$file: $size bytes, want $((32 + 4 * want))"
  [ "$(head -c 8 "$file")" = "ITHACATK" ] || fail "$file: bad magic"
}

# Two documents: BOS a b \n, BOS c d \n = 8 tokens (the blank lines produce none).
printf 'ab\n\n\ncd\n' > "$tmp/small.txt"
out=$("$tokenize" --input "$tmp/small.txt" --output "$tmp/small.tok") || fail "tokenize failed"
echo "$out"
echo "$out" | grep -q ": 8 tokens, 2 documents" || fail "unexpected output: $out"
check_file "$tmp/small.tok" 8

# The demo corpus: the printed count matches the file.
out=$("$tokenize" --input "$corpus" --output "$tmp/corpus.tok") || fail "tokenize corpus failed"
echo "$out"
n=$(echo "$out" | sed -n 's/.*: \([0-9]*\) tokens, \([0-9]*\) documents.*/\1/p')
docs=$(echo "$out" | sed -n 's/.*: \([0-9]*\) tokens, \([0-9]*\) documents.*/\2/p')
[ -n "$n" ] && [ "$n" -gt 10000 ] || fail "corpus: too few tokens: '$n'"
[ -n "$docs" ] && [ "$docs" -ge 5 ] || fail "corpus: too few documents: '$docs'"
check_file "$tmp/corpus.tok" "$n"

# A missing input fails, names the file, and writes nothing.
if err=$("$tokenize" --input "$tmp/missing.txt" --output "$tmp/missing.tok" 2>&1); then
  fail "missing input succeeded"
fi
echo "$err"
echo "$err" | grep -q "missing.txt: cannot open" || fail "unclear error: $err"
[ ! -e "$tmp/missing.tok" ] || fail "output written for a missing input"

# Missing flags are a usage error.
if "$tokenize" --input "$tmp/small.txt" 2>/dev/null; then fail "missing --output accepted"; fi
echo PASS
