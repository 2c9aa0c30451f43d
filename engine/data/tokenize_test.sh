#!/bin/bash
# ithaca-tokenize end to end: token counts in the output and in the file header, file size, and a
# clear error for a missing input. Args: the tokenizer binary, the demo corpus.
set -u
tokenize="$1"
corpus="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*" >&2; exit 1; }

# A version 2 file: the header's uint64 token count (offset 16) and document count (offset 24)
# must agree with the expected ones, and the file size with both (128-byte header, tokens padded
# to 8 bytes, 8 bytes per document).
check_file() {
  local file="$1" want="$2" docs="$3"
  local version count ndocs size
  version=$(od -An -t u4 -j 8 -N 4 "$file" | tr -d ' ')
  count=$(od -An -t u8 -j 16 -N 8 "$file" | tr -d ' ')
  ndocs=$(od -An -t u8 -j 24 -N 8 "$file" | tr -d ' ')
  size=$(stat -c %s "$file")
  [ "$version" = 2 ] || fail "$file: version $version, want 2"
  [ "$count" = "$want" ] || fail "$file: header count $count, want $want"
  [ "$ndocs" = "$docs" ] || fail "$file: header documents $ndocs, want $docs"
  local expect=$((128 + 4 * want + 4 * (want % 2) + 8 * docs))
  [ "$size" = "$expect" ] || fail "$file: $size bytes, want $expect"
  [ "$(head -c 8 "$file")" = "ITHACATK" ] || fail "$file: bad magic"
}

# Two documents: BOS a b \n, BOS c d \n = 8 tokens (the blank lines produce none).
printf 'ab\n\n\ncd\n' > "$tmp/small.txt"
out=$("$tokenize" --input "$tmp/small.txt" --output "$tmp/small.tok") || fail "tokenize failed"
echo "$out"
echo "$out" | grep -q ": 8 tokens, 2 documents" || fail "unexpected output: $out"
check_file "$tmp/small.tok" 8 2
# The document index: offsets 0 and 4.
[ "$(od -An -t u8 -j $((128 + 32)) -N 16 "$tmp/small.tok" | xargs)" = "0 4" ] || fail "bad document index"

# The demo corpus: the printed count matches the file.
out=$("$tokenize" --input "$corpus" --output "$tmp/corpus.tok") || fail "tokenize corpus failed"
echo "$out"
n=$(echo "$out" | sed -n 's/.*: \([0-9]*\) tokens, \([0-9]*\) documents.*/\1/p')
docs=$(echo "$out" | sed -n 's/.*: \([0-9]*\) tokens, \([0-9]*\) documents.*/\2/p')
[ -n "$n" ] && [ "$n" -gt 10000 ] || fail "corpus: too few tokens: '$n'"
[ -n "$docs" ] && [ "$docs" -ge 5 ] || fail "corpus: too few documents: '$docs'"
check_file "$tmp/corpus.tok" "$n" "$docs"

# A missing input fails, names the file, and writes nothing.
if err=$("$tokenize" --input "$tmp/missing.txt" --output "$tmp/missing.tok" 2>&1); then
  fail "missing input succeeded"
fi
echo "$err"
echo "$err" | grep -q "missing.txt: cannot open" || fail "unclear error: $err"
[ ! -e "$tmp/missing.tok" ] || fail "output written for a missing input"

# Another tokenizer is the Python tool's: a usage error that says so.
if err=$("$tokenize" --tokenizer /some/tokenizer.json --input "$tmp/small.txt" \
    --output "$tmp/other.tok" 2>&1); then
  fail "--tokenizer PATH accepted"
fi
echo "$err" | grep -q "tools/tokenize/ithaca-tokenize" || fail "unclear error: $err"
"$tokenize" --tokenizer byte --input "$tmp/small.txt" --output "$tmp/byte.tok" >/dev/null ||
  fail "--tokenizer byte failed"
cmp "$tmp/byte.tok" "$tmp/small.tok" || fail "--tokenizer byte differs from the default"

# Missing flags are a usage error.
if "$tokenize" --input "$tmp/small.txt" 2>/dev/null; then fail "missing --output accepted"; fi
echo PASS
