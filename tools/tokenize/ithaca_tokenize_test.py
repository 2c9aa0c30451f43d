"""ithaca-tokenize (Python): its token files, read back by the C++ reader (token_file_dump), hold
exactly `tokenizers`' own ids; inputs of every kind; bad input fails naming the file and leaves
nothing behind. Runs from Bazel's runfiles (or the repository root)."""

import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ithaca_tokenize  # noqa: E402

from tokenizers import Tokenizer  # noqa: E402

TOOL = os.path.join(HERE, "ithaca_tokenize.py")
DUMP = "engine/data/token_file_dump"
BYTE_TOOL = "engine/data/ithaca-tokenize"
BPE_DIR = "engine/data/testdata/bpe"
BPE_JSON = os.path.join(BPE_DIR, "tokenizer.json")
CORPUS = "engine/data/testdata/tiny_corpus.txt"
TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def write(path, data):
    with open(path, "wb" if isinstance(data, (bytes, bytearray)) else "w") as f:
        f.write(data)


def run_tool(*args):
    return subprocess.run([sys.executable, TOOL, "--no-progress", *args], capture_output=True,
                          text=True)


def dump(*args):
    """The files as the C++ reader sees them."""
    r = subprocess.run([DUMP, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"token_file_dump failed: {r.stderr}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def split_documents(files):
    """One split's files (in order) -> the documents' ids, joining a document cut over shards."""
    docs = []
    for f in files:
        starts = f["doc_starts"]
        toks = f["tokens"]
        if not starts or starts[0] > 0:  # the shard continues the previous one's last document
            docs[-1].extend(toks[:starts[0] if starts else len(toks)])
        for i, s in enumerate(starts):
            docs.append(list(toks[s:starts[i + 1] if i + 1 < len(starts) else len(toks)]))
    return docs


def corpus_documents():
    return list(ithaca_tokenize.text_documents(CORPUS))


class Fresh(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=TMP)

    def assertNothingLeft(self, out):
        self.assertFalse(os.path.exists(out), f"{out} was left behind")
        self.assertEqual(glob.glob(out + ".tmp.*"), [], "a temporary directory was left behind")


class BpeTest(Fresh):
    def setUp(self):
        super().setUp()
        self.hf = Tokenizer.from_file(BPE_JSON)
        # tokenizer_config.json says add_bos_token and add_eos_token: <s> ids </s>.
        self.bos, self.eos = self.hf.token_to_id("<s>"), self.hf.token_to_id("</s>")

    def expected(self, docs):
        return [[self.bos] + e.ids + [self.eos]
                for e in self.hf.encode_batch(docs, add_special_tokens=False)]

    def test_glob_shards_and_val_split_read_back_by_cpp(self):
        # Two copies of the corpus through a glob; shards of at most 1000 tokens; 20% held out.
        for name in ("a.txt", "b.txt"):
            shutil.copy(CORPUS, os.path.join(self.dir, name))
        out = os.path.join(self.dir, "out")
        r = run_tool("--tokenizer", BPE_DIR, "--output", out, "--shard-tokens", "1000",
                     "--val-fraction", "0.2", os.path.join(self.dir, "*.txt"))
        self.assertEqual(r.returncode, 0, r.stderr)
        print(r.stdout)
        train = dump(os.path.join(out, "train-*.tok"))
        val = dump(os.path.join(out, "val-*.tok"))
        self.assertGreater(len(train), 3, "several shards")
        self.assertGreaterEqual(len(val), 1)
        fingerprint = hashlib.sha256(read(BPE_JSON, "rb")).hexdigest()
        for f in train + val:
            self.assertEqual(f["version"], 2)
            self.assertEqual(f["vocab_size"], self.hf.get_vocab_size())
            self.assertEqual((f["bos_id"], f["eos_id"]), (self.bos, self.eos))
            self.assertEqual(f["fingerprint"], fingerprint)
            self.assertLessEqual(len(f["tokens"]), 1000)
            self.assertFalse(f["has_loss_mask"])
        # Every document is in exactly one split, each split in input order, with the ids of
        # tokenizers' own encode.
        want = self.expected(corpus_documents() * 2)
        got_train, got_val = split_documents(train), split_documents(val)
        self.assertEqual(len(got_train) + len(got_val), len(want))
        self.assertGreater(len(got_val), 0)
        i = j = 0
        for w in want:
            if i < len(got_train) and got_train[i] == w:
                i += 1
            else:
                self.assertLess(j, len(got_val))
                self.assertEqual(got_val[j], w)
                j += 1
        # The C++ DataLoader takes the set with the model's own tokenizer...
        r = subprocess.run([DUMP, "--seq_len", "64", "--model_vocab", "600", "--model_tokenizer",
                            BPE_JSON, os.path.join(out, "train-*.tok")], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("samples per epoch", r.stdout)
        self.assertNotIn("warning", r.stdout)
        # ...and rejects it for a model whose tokenizer.json differs, naming both.
        other = os.path.join(self.dir, "other-model")
        os.makedirs(other)
        text = read(BPE_JSON)
        write(os.path.join(other, "tokenizer.json"), text.replace('"<s>"', '"<bos>"'))
        r = subprocess.run([DUMP, "--seq_len", "64", "--model_vocab", "600", "--model_tokenizer",
                            os.path.join(other, "tokenizer.json"),
                            os.path.join(out, "train-*.tok")], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(os.path.join(out, "train-00000.tok") + ": tokenized with tokenizer sha256 "
                      + fingerprint, r.stderr)
        self.assertIn(os.path.join(other, "tokenizer.json") + " has sha256", r.stderr)
        # ...and a model with a smaller vocabulary than the ids.
        r = subprocess.run([DUMP, "--seq_len", "64", "--model_vocab", "300",
                            os.path.join(out, "train-*.tok")], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("vocab_size 600 exceeds the model's vocab_size 300", r.stderr)

    def test_post_processor_decides_without_a_config(self):
        bare = os.path.join(self.dir, "bare")
        os.makedirs(bare)
        shutil.copy(BPE_JSON, bare)
        out = os.path.join(self.dir, "out")
        r = run_tool("--tokenizer", os.path.join(bare, "tokenizer.json"), "--output", out, CORPUS)
        self.assertEqual(r.returncode, 0, r.stderr)
        files = dump(os.path.join(out, "*.tok"))
        want = [e.ids for e in self.hf.encode_batch(corpus_documents())]  # <s> from the template
        self.assertEqual(want[0][0], self.bos)
        self.assertNotEqual(want[0][-1], self.eos)
        self.assertEqual(split_documents(files), want)

    def test_jsonl_and_parquet(self):
        import pyarrow as pa
        import pyarrow.parquet as pq
        docs = corpus_documents()
        jsonl = os.path.join(self.dir, "docs.jsonl")
        with open(jsonl, "w") as f:
            for d in docs[:20]:
                f.write(json.dumps({"id": 1, "body": d}) + "\n")
        parquet = os.path.join(self.dir, "docs.parquet")
        pq.write_table(pa.table({"body": docs[20:], "n": list(range(len(docs) - 20))}), parquet)
        out = os.path.join(self.dir, "out")
        r = run_tool("--tokenizer", BPE_DIR, "--field", "body", "--output", out, jsonl, parquet)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(split_documents(dump(os.path.join(out, "*.tok"))), self.expected(docs))

    def test_bad_inputs_name_the_file_and_leave_nothing(self):
        out = os.path.join(self.dir, "out")
        good_jsonl = os.path.join(self.dir, "good.jsonl")
        with open(good_jsonl, "w") as f:
            f.write('{"text": "one"}\n{"text": "two"}\n')
        truncated_jsonl = os.path.join(self.dir, "cut.jsonl")
        with open(truncated_jsonl, "w") as f:
            f.write('{"text": "one"}\n{"text": "tw')
        nofield = os.path.join(self.dir, "nofield.jsonl")
        with open(nofield, "w") as f:
            f.write('{"body": "one"}\n')
        import pyarrow as pa
        import pyarrow.parquet as pq
        parquet = os.path.join(self.dir, "good.parquet")
        pq.write_table(pa.table({"text": ["a b c"] * 100}), parquet)
        cut_parquet = os.path.join(self.dir, "cut.parquet")
        with open(cut_parquet, "wb") as f:
            f.write(read(parquet, "rb")[:-20])
        cut_tok = os.path.join(self.dir, "cut-tok")
        os.makedirs(cut_tok)
        text = read(BPE_JSON)
        write(os.path.join(cut_tok, "tokenizer.json"), text[: len(text) // 2])
        bad_cfg = os.path.join(self.dir, "bad-cfg")
        os.makedirs(bad_cfg)
        shutil.copy(BPE_JSON, bad_cfg)
        write(os.path.join(bad_cfg, "tokenizer_config.json"), 
            '{"add_bos_token": true, "bos_token": "<nope>"}')
        not_utf8 = os.path.join(self.dir, "latin1.txt")
        write(not_utf8, b"caf\xe9\n")
        cases = [
            (["--tokenizer", BPE_DIR, os.path.join(self.dir, "missing.txt")], "missing.txt: no such file"),
            (["--tokenizer", BPE_DIR, os.path.join(self.dir, "none-*.jsonl")], "none-*.jsonl: the pattern matches no file"),
            (["--tokenizer", BPE_DIR, good_jsonl, truncated_jsonl], "cut.jsonl:2: not valid JSON"),
            (["--tokenizer", BPE_DIR, nofield], "nofield.jsonl:1: no field 'text'"),
            (["--tokenizer", BPE_DIR, cut_parquet], "cut.parquet: not a readable Parquet file"),
            (["--tokenizer", BPE_DIR, "--field", "body", parquet], "good.parquet: no column 'body'"),
            (["--tokenizer", BPE_DIR, not_utf8], "latin1.txt: not UTF-8 text"),
            (["--tokenizer", os.path.join(self.dir, "nowhere"), CORPUS], "nowhere: no such model directory or tokenizer.json"),
            (["--tokenizer", cut_tok, CORPUS], "cut-tok/tokenizer.json: not a valid tokenizer.json"),
            (["--tokenizer", bad_cfg, CORPUS], "tokenizer_config.json: bos_token '<nope>' is not in the vocabulary"),
        ]
        for args, message in cases:
            with self.subTest(message):
                r = run_tool("--output", out, *args)
                self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
                self.assertIn(message, r.stderr)
                self.assertNothingLeft(out)
        # An output directory that already holds files is not touched.
        os.makedirs(out)
        write(os.path.join(out, "keep"), "x")
        r = run_tool("--tokenizer", BPE_DIR, "--output", out, CORPUS)
        self.assertEqual(r.returncode, 1)
        self.assertIn("already exists and is not an empty directory", r.stderr)
        self.assertEqual(os.listdir(out), ["keep"])

    def test_cpp_rejects_a_truncated_or_corrupt_shard(self):
        out = os.path.join(self.dir, "out")
        self.assertEqual(run_tool("--tokenizer", BPE_DIR, "--output", out, CORPUS).returncode, 0)
        shard = os.path.join(out, "train-00000.tok")
        data = read(shard, "rb")
        cut = os.path.join(self.dir, "cut.tok")
        write(cut, data[:-3])
        r = subprocess.run([DUMP, cut], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(cut + ": file is", r.stderr)
        self.assertIn("(truncated or corrupt)", r.stderr)
        bad = bytearray(data)
        bad[128:132] = (4000).to_bytes(4, "little")  # token 0 beyond the vocabulary
        corrupt = os.path.join(self.dir, "corrupt.tok")
        write(corrupt, bad)
        r = subprocess.run([DUMP, corrupt], capture_output=True, text=True)
        self.assertIn(corrupt + ": token 0 (byte offset 128) is 4000, >= the file's vocab_size 600",
                      r.stderr)


class ByteLevelTest(Fresh):
    def test_same_bytes_as_the_cpp_tool(self):
        out = os.path.join(self.dir, "out")
        r = run_tool("--output", out, CORPUS)  # --tokenizer byte is the default
        self.assertEqual(r.returncode, 0, r.stderr)
        cpp = os.path.join(self.dir, "cpp.tok")
        subprocess.run([BYTE_TOOL, "--input", CORPUS, "--output", cpp], check=True,
                       capture_output=True)
        self.assertEqual(read(os.path.join(out, "train-00000.tok"), "rb"),
                         read(cpp, "rb"))
        # A byte-level file for a 128K-vocabulary model: accepted with a warning.
        r = subprocess.run([DUMP, "--seq_len", "64", "--model_vocab", "128256", cpp],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: " + cpp + ": byte-level tokens (vocab_size 258) for a model with "
                      "128256 tokens", r.stdout)

class SftTest(Fresh):
    """--sft: tokens and the per-token loss mask, as the C++ reader sees them."""

    def setUp(self):
        super().setUp()
        self.hf = Tokenizer.from_file(BPE_JSON)
        self.bos, self.eos = self.hf.token_to_id("<s>"), self.hf.token_to_id("</s>")

    def plain(self, text):
        return self.hf.encode(text, add_special_tokens=False).ids

    def sft(self, tokenizer, records):
        src = os.path.join(self.dir, "sft.jsonl")
        write(src, "".join(json.dumps(r) + "\n" for r in records))
        out = os.path.join(self.dir, "out")
        r = run_tool("--sft", "--tokenizer", tokenizer, "--output", out, src)
        return r, out

    def test_prompt_and_completion(self):
        records = [{"prompt": "Question: what is it?\n", "completion": "An answer."},
                   {"prompt": "Hi", "completion": " there, friend"}]
        r, out = self.sft(BPE_DIR, records)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("loss mask:", r.stdout)
        [f] = dump(os.path.join(out, "*.tok"))
        self.assertTrue(f["has_loss_mask"])
        tokens, mask, starts = [], [], []
        for rec in records:
            p, c = self.plain(rec["prompt"]), self.plain(rec["completion"])
            starts.append(len(tokens))
            tokens += [self.bos] + p + c + [self.eos]
            mask += [0] * (1 + len(p)) + [1] * (len(c) + 1)
        self.assertEqual(f["tokens"], tokens)
        self.assertEqual(f["loss_mask"], mask)
        self.assertEqual(f["doc_starts"], starts)

    def test_byte_level(self):
        r, out = self.sft("byte", [{"prompt": "ab", "completion": "c"}])
        self.assertEqual(r.returncode, 0, r.stderr)
        [f] = dump(os.path.join(out, "*.tok"))
        self.assertEqual(f["tokens"], [256, ord("a"), ord("b"), ord("c")])
        self.assertEqual(f["loss_mask"], [0, 0, 0, 1])

    def test_messages_use_the_chat_template_and_train_assistant_turns(self):
        model = os.path.join(self.dir, "model")
        os.makedirs(model)
        shutil.copy(BPE_JSON, model)
        cfg = json.loads(read(os.path.join(BPE_DIR, "tokenizer_config.json")))
        # trim_blocks (as Hugging Face renders) drops a newline after a tag: the template writes
        # its newlines as expressions.
        cfg["chat_template"] = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] "
                                "{{ m['content'] }}{% if m['role'] == 'assistant' %}"
                                "{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
                                "{% if add_generation_prompt %}[assistant] {% endif %}")
        write(os.path.join(model, "tokenizer_config.json"), json.dumps(cfg))
        conv = {"messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Name a colour."},
                             {"role": "assistant", "content": "Blue."},
                             {"role": "user", "content": "Another?"},
                             {"role": "assistant", "content": "Red."}]}
        r, out = self.sft(model, [conv])  # jinja2 is pinned in tools/requirements.txt
        self.assertEqual(r.returncode, 0, r.stderr)
        [f] = dump(os.path.join(out, "*.tok"))
        pieces = [("<s>[system] Be brief.\n[user] Name a colour.\n[assistant] ", 0),
                  ("Blue.</s>\n", 1), ("[user] Another?\n[assistant] ", 0), ("Red.</s>\n", 1)]
        tokens, mask = [], []
        for text, keep in pieces:
            ids = self.plain(text)
            tokens += ids
            mask += [keep] * len(ids)
        self.assertEqual(f["tokens"], tokens)
        self.assertEqual(f["loss_mask"], mask)

    def test_bad_sft_input(self):
        r, out = self.sft(BPE_DIR, [{"messages": [{"role": "user", "content": "x"}]}])
        self.assertEqual(r.returncode, 1)
        self.assertIn("no chat_template", r.stderr)
        self.assertNothingLeft(out)
        r, out = self.sft(BPE_DIR, [{"prompt": "only a prompt"}])
        self.assertEqual(r.returncode, 1)
        self.assertIn("sft.jsonl:1: needs string fields `prompt` and `completion`", r.stderr)
        self.assertNothingLeft(out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
