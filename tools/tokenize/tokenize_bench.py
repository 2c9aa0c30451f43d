"""Tokenization throughput: ithaca-tokenize's whole pipeline (read the text, split documents,
encode, write token files) next to `tokenizers`' own encode_batch on the same documents, in the
same run. Prints both in tokens/s and their ratio; exits 1 when the ratio is below --min-ratio.

    bazel run //tools/tokenize:tokenize_bench -- [--tokenizer DIR] [--mib 8] [--min-ratio 0.8]
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ithaca_tokenize  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="engine/data/testdata/bpe",
                    help="model directory or tokenizer.json (default: the BPE test fixture)")
    ap.add_argument("--corpus", default="engine/data/testdata/tiny_corpus.txt",
                    help="text repeated up to --mib MiB")
    ap.add_argument("--mib", type=float, default=8)
    ap.add_argument("--repeats", type=int, default=3, help="best of N for each side")
    ap.add_argument("--min-ratio", type=float, default=0.8)
    a = ap.parse_args()
    # `bazel run` starts in the runfiles tree; paths given by the user are relative to where
    # they ran it.
    cwd = os.environ.get("BUILD_WORKING_DIRECTORY")
    resolve = lambda p: p if os.path.exists(p) or not cwd else os.path.join(cwd, p)
    tok = ithaca_tokenize.Tokenizer(resolve(a.tokenizer))
    with open(resolve(a.corpus), encoding="utf-8") as f:
        unit = f.read().rstrip("\n") + "\n\n"
    tmp = tempfile.mkdtemp()
    text_path = os.path.join(tmp, "corpus.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(unit * max(1, int(a.mib * 2**20 / len(unit.encode()))))
    docs = list(ithaca_tokenize.text_documents(text_path))

    def ours():
        out = os.path.join(tmp, "out")
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        s = ithaca_tokenize.tokenize(tok, [text_path], out)
        return s["tokens"], time.perf_counter() - t

    def reference():
        # `tokenizers` alone on the same documents, already in memory: encoding only. The
        # special tokens the config adds are counted, not added.
        t = time.perf_counter()
        specials = int(tok.add_bos) + int(tok.add_eos) if tok.explicit else 0
        n = 0
        for i in range(0, len(docs), 1024):
            encs = tok.tok.encode_batch(docs[i:i + 1024], add_special_tokens=not tok.explicit)
            n += sum(len(e.ids) + specials for e in encs)
        return n, time.perf_counter() - t

    best = {"ithaca-tokenize": 0.0, "tokenizers encode_batch": 0.0}
    counts = {}
    for _ in range(a.repeats):
        for name, fn in (("ithaca-tokenize", ours), ("tokenizers encode_batch", reference)):
            n, secs = fn()
            counts[name] = n
            best[name] = max(best[name], n / secs)
    shutil.rmtree(tmp, ignore_errors=True)
    if counts["ithaca-tokenize"] != counts["tokenizers encode_batch"]:
        print(f"token counts differ: {counts}", file=sys.stderr)
        return 1
    ratio = best["ithaca-tokenize"] / best["tokenizers encode_batch"]
    print(f"tokenizer {tok.path}, vocab {tok.vocab_size}, {len(docs)} documents, "
          f"{counts['ithaca-tokenize']} tokens, {os.cpu_count()} cores")
    for name, rate in best.items():
        print(f"{name:>24}: {rate:12,.0f} tokens/s")
    print(f"{'ratio':>24}: {ratio:.2f} (>= {a.min_ratio} wanted)")
    return 0 if ratio >= a.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
