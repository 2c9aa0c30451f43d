#!/bin/bash
# passkey_corpus writes windows that are passkey prompts: every window starts a document, each
# document is one prompt (BOS, the key sentence, the question, the key as its last tokens), packed
# prompts are power-of-two parts of at least --pack_min tokens, and the same seed writes the same
# file. Read back through the C++ reader (token_file_dump).
set -euo pipefail
CORPUS=$1
DUMP=$2
T=${TEST_TMPDIR:-$(mktemp -d)}
"$CORPUS" --out "$T/one.tok" --length 512 --count 6 --seed 3
"$CORPUS" --out "$T/packed.tok" --length 1024 --count 40 --pack_min 128 --seed 3
"$CORPUS" --out "$T/again.tok" --length 1024 --count 40 --pack_min 128 --seed 3
"$CORPUS" --out "$T/other.tok" --length 1024 --count 40 --pack_min 128 --seed 4
cmp "$T/packed.tok" "$T/again.tok"
! cmp -s "$T/packed.tok" "$T/other.tok"
if "$CORPUS" --out "$T/short.tok" --length 64 --count 1 2> "$T/err"; then
  echo "a 64-token prompt was written"; exit 1
fi
grep -q "eval.passkey.lengths: 64 tokens cannot hold a passkey prompt" "$T/err"
for f in one packed; do "$DUMP" "$T/$f.tok" > "$T/$f.json"; done
python3 - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
def docs(name, length, count):
    d = json.load(open(f"{t}/{name}.json"))
    tok, starts = d["tokens"], d["doc_starts"]
    assert (d["vocab_size"], d["bos_id"]) == (258, 256), d
    assert len(tok) == length * count, len(tok)
    for w in range(count):
        assert w * length in starts, f"window {w} does not start a document"
    ends = starts[1:] + [len(tok)]
    out = []
    for a, b in zip(starts, ends):
        assert tok[a] == 256, f"document at {a} does not start with BOS"
        text = bytes(tok[a + 1:b]).decode()
        key = re.search(r"The pass key is (\d{5})\. Remember it\. \1 is the pass key\.", text)
        assert key, text[:200]
        assert text.endswith(" What is the pass key? The pass key is " + key.group(1)), text[-80:]
        out.append(b - a)
    return out
assert docs("one", 512, 6) == [512] * 6
sizes = docs("packed", 1024, 40)
assert set(sizes) <= {1024, 512, 256, 128}, set(sizes)
assert len(set(sizes)) >= 3, f"packing drew too few sizes: {set(sizes)}"
print(f"ok: {len(sizes)} packed prompts, sizes {sorted(set(sizes))}")
PY
