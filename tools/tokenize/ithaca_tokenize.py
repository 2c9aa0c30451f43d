#!/usr/bin/env python3
"""ithaca-tokenize with a model's own tokenizer: text, JSON Lines or Parquet in, token files out.

    ithaca-tokenize --tokenizer MODEL_DIR_OR_TOKENIZER_JSON --output OUT_DIR [--field text]
                    [--shard-tokens N] [--val-fraction F] INPUT [INPUT ...]

Inputs are files or glob patterns: *.txt (documents separated by blank lines, as the byte-level
tokenizer splits them), *.jsonl / *.json (one JSON object per line, the document in --field),
*.parquet (the --field column). Encoding is `tokenizers`' encode_batch, which runs on all cores.
BOS/EOS follow the tokenizer: tokenizer_config.json's add_bos_token / add_eos_token with its
bos_token / eos_token when it says, else the tokenizer's own post-processor.
OUT_DIR receives train-00000.tok, ... (and val-00000.tok, ... with --val-fraction): version 2
token files (engine/data/token_file.h) of at most --shard-tokens tokens each. OUT_DIR is
written under a temporary name and renamed at the end, so a failure leaves nothing behind.
--tokenizer byte is the built-in byte-level tokenizer (the C++ ithaca-tokenize's output).

--sft (supervised fine-tuning; JSON Lines input): each line is one document, either
{"prompt": ..., "completion": ...} or {"messages": [{"role": ..., "content": ...}, ...]}, and
the files get a loss mask (data.loss_mask = true trains only the masked-in tokens):
  prompt/completion: BOS (as the tokenizer adds it) + the prompt's tokens, mask 0; then the
    completion's tokens + EOS (when the tokenizer has one), mask 1. Prompt and completion are
    tokenized separately, so no token spans the boundary.
  messages: rendered with the chat template of tokenizer_config.json (needs the Python package
    `jinja2`; a tokenizer without a template is refused). Each assistant turn's content and
    end-of-turn tokens get mask 1 (what the template adds after the assistant header, found by
    rendering with add_generation_prompt); everything else (system, user, tool turns and the
    assistant headers) mask 0. The template must render the conversation prefix by prefix.
"""

import argparse
import glob
import hashlib
import json
import os
import random
import shutil
import struct
import sys
import time
from array import array
from concurrent.futures import ThreadPoolExecutor

MAGIC = b"ITHACATK"
VERSION = 2
HEADER_BYTES = 128
FLAG_LOSS_MASK = 1
BYTE_BOS, BYTE_VOCAB = 256, 258


class InputError(Exception):
    """A problem with an input the user named; the message names the file."""


# ---- Tokenizers ----


class Tokenizer:
    """A tokenizer.json through `tokenizers`, with the BOS/EOS policy of its directory."""

    def __init__(self, path):
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError:
            raise InputError("the Python package `tokenizers` is not installed "
                             "(tools/setup.sh installs it into .venv)")
        if not os.path.exists(path):
            raise InputError(f"{path}: no such model directory or tokenizer.json")
        json_path = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
        if not os.path.isfile(json_path):
            raise InputError(f"{json_path}: no such tokenizer file")
        with open(json_path, "rb") as f:
            raw = f.read()
        self.fingerprint = hashlib.sha256(raw).digest()
        try:
            self.tok = HfTokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # tokenizers raises its own Exception type for bad JSON
            raise InputError(f"{json_path}: not a valid tokenizer.json: {e}")
        self.path = json_path
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)
        cfg = self._config(os.path.join(os.path.dirname(json_path), "tokenizer_config.json"))
        self.config = cfg
        self.bos_id = self._token_id(cfg.get("bos_token"), "bos_token")
        self.eos_id = self._token_id(cfg.get("eos_token"), "eos_token")
        # The config's flags, when present, are the model's convention (Llama 2 style); without
        # them the post-processor in tokenizer.json decides (Llama 3's TemplateProcessing).
        self.explicit = "add_bos_token" in cfg or "add_eos_token" in cfg
        self.add_bos = bool(cfg.get("add_bos_token", False))
        self.add_eos = bool(cfg.get("add_eos_token", False))
        for flag, tid in (("add_bos_token", self.bos_id), ("add_eos_token", self.eos_id)):
            if cfg.get(flag) and tid < 0:
                raise InputError(f"{self.config_path}: {flag} is true but its token is not set "
                                 f"or not in the vocabulary")

    def _config(self, path):
        self.config_path = path
        if not os.path.exists(path):
            return {}
        try:
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: not valid JSON: {e}")
        if not isinstance(cfg, dict):
            raise InputError(f"{path}: not a JSON object")
        return cfg

    def _token_id(self, tok, key):
        if isinstance(tok, dict):  # {"content": "<s>", ...} in older configs
            tok = tok.get("content")
        if tok is None:
            return -1
        tid = self.tok.token_to_id(tok)
        if tid is None:
            raise InputError(f"{self.config_path}: {key} {tok!r} is not in the vocabulary")
        return tid

    def encode_batch(self, texts):
        encs = self.tok.encode_batch(texts, add_special_tokens=not self.explicit)
        if not self.explicit:
            return [e.ids for e in encs]
        pre = [self.bos_id] if self.add_bos else []
        post = [self.eos_id] if self.add_eos else []
        return [pre + e.ids + post for e in encs]

    def encode_plain(self, texts):
        """Without BOS/EOS (special tokens written in the text are still recognized)."""
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def adds_bos(self):
        if self.explicit:
            return self.add_bos and self.bos_id >= 0
        ids = self.tok.encode("", add_special_tokens=True).ids
        return self.bos_id >= 0 and ids[:1] == [self.bos_id]

    def chat_template(self):
        """The config's chat template as a jinja2 Template (InputError when there is none)."""
        tpl = self.config.get("chat_template")
        if isinstance(tpl, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
            tpl = named.get("default")
        if not isinstance(tpl, str):
            raise InputError(f"{self.config_path}: no chat_template, so chat `messages` cannot be "
                             f"rendered (give `prompt` and `completion` instead)")
        try:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise InputError("rendering chat `messages` needs the Python package `jinja2` "
                             "(pip install jinja2), or give `prompt` and `completion` instead")

        def raise_exception(message):
            raise InputError(f"{self.config_path}: the chat template says: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
        try:
            return env.from_string(tpl)
        except jinja2.TemplateError as e:
            raise InputError(f"{self.config_path}: chat_template does not parse: {e}")

    def special_text(self, tid):
        return self.tok.id_to_token(tid) if tid >= 0 else ""


class ByteTokenizer:
    """ByteTokenize of engine/data/token_file.h: BOS then the document's UTF-8 bytes."""
    fingerprint = bytes(32)
    vocab_size = BYTE_VOCAB
    bos_id, eos_id = BYTE_BOS, -1
    path = "byte"

    def encode_batch(self, texts):
        return [[BYTE_BOS] + list(t.encode("utf-8")) for t in texts]

    def encode_plain(self, texts):
        return [list(t.encode("utf-8")) for t in texts]

    def adds_bos(self):
        return True

    def chat_template(self):
        raise InputError("the byte-level tokenizer has no chat template, so chat `messages` "
                         "cannot be rendered (give `prompt` and `completion` instead)")


# ---- SFT: (tokens, loss mask) per record ----


def sft_records(path):
    """The JSON objects of a JSON Lines file, with their line numbers."""
    if not path.lower().endswith((".jsonl", ".json", ".ndjson")):
        raise InputError(f"{path}: --sft reads JSON Lines (.jsonl) with prompt/completion or "
                         f"messages fields")
    for n, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{n}: not a JSON object")
        yield f"{path}:{n}", obj


class SftEncoder:
    """Turns SFT records into (ids, mask) with mask 1 on the tokens the loss trains."""

    def __init__(self, tok):
        self.tok = tok
        self.template = None
        self.bos = [tok.bos_id] if tok.adds_bos() and tok.bos_id >= 0 else []
        self.eos = [tok.eos_id] if tok.eos_id >= 0 else []

    def encode(self, where, obj):
        if "messages" in obj:
            return self._messages(where, obj["messages"])
        for key in ("prompt", "completion"):
            if not isinstance(obj.get(key), str):
                raise InputError(f"{where}: needs string fields `prompt` and `completion` (or a "
                                 f"`messages` list)")
        p, c = self.tok.encode_plain([obj["prompt"], obj["completion"]])
        ids = self.bos + p + c + self.eos
        mask = [0] * (len(self.bos) + len(p)) + [1] * (len(c) + len(self.eos))
        return ids, mask

    def _render(self, where, messages, generation):
        try:
            return self.template.render(messages=messages, add_generation_prompt=generation,
                                        bos_token=self.tok.special_text(self.tok.bos_id),
                                        eos_token=self.tok.special_text(self.tok.eos_id))
        except InputError:
            raise
        except Exception as e:  # jinja2's errors, and whatever the template's filters raise
            raise InputError(f"{where}: the chat template fails on these messages: {e}")

    def _messages(self, where, messages):
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise InputError(f"{where}: `messages` must be a non-empty list of objects with a "
                             f"`role`")
        if self.template is None:
            self.template = self.tok.chat_template()
        # Text pieces with their mask, from rendering the conversation prefix by prefix.
        pieces, done = [], ""
        for i, m in enumerate(messages):
            full = self._render(where, messages[:i + 1], False)
            if m["role"] == "assistant":
                header = self._render(where, messages[:i], True)
                if header.startswith(done) and full.startswith(header):
                    pieces += [(header[len(done):], 0), (full[len(header):], 1)]
                    done = full
                    continue
            if not full.startswith(done):
                raise InputError(f"{where}: the chat template does not render the conversation "
                                 f"prefix by prefix, so turns cannot be masked")
            pieces.append((full[len(done):], 1 if m["role"] == "assistant" else 0))
            done = full
        pieces = [(t, k) for t, k in pieces if t]
        ids, mask = [], []
        for (text, keep), piece in zip(pieces, self.tok.encode_plain([t for t, _ in pieces])):
            ids += piece
            mask += [keep] * len(piece)
        # A template that writes no BOS text gets the tokenizer's BOS, as plain text would.
        if self.bos and ids[:1] != self.bos:
            ids, mask = self.bos + ids, [0] + mask
        return ids, mask


# ---- Inputs: each yields (documents, bytes read) in batches ----


def expand_inputs(patterns):
    files = []
    for p in patterns:
        if glob.has_magic(p):
            hits = sorted(glob.glob(p, recursive=True))
            if not hits:
                raise InputError(f"{p}: the pattern matches no file")
            files.extend(hits)
        else:
            if not os.path.isfile(p):
                raise InputError(f"{p}: no such file")
            files.append(p)
    return files


def text_documents(path):
    """Runs of non-blank lines, newlines included (ByteTokenize's split)."""
    doc = []
    try:
        with open(path, encoding="utf-8", newline="") as f:
            for line in f:
                if line.strip(" \t\r\n"):
                    doc.append(line)
                elif doc:
                    yield "".join(doc)
                    doc = []
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start} of a chunk)")
    if doc:
        yield "".join(doc)


def json_lines(path):
    """(line number, parsed value) of each non-blank line of a JSON Lines file."""
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise InputError(f"{path}:{n}: not valid JSON ({e}); a truncated file?")
            yield n, obj


def jsonl_documents(path, field):
    for n, obj in json_lines(path):
        if not isinstance(obj, dict) or field not in obj:
            raise InputError(f"{path}:{n}: no field {field!r} (use --field)")
        if not isinstance(obj[field], str):
            raise InputError(f"{path}:{n}: field {field!r} is not a string")
        yield obj[field]


def parquet_documents(path, field):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise InputError(f"{path}: reading Parquet needs the Python package `pyarrow`")
    try:
        pf = pq.ParquetFile(path)
        if field not in pf.schema_arrow.names:
            raise InputError(f"{path}: no column {field!r} (columns: "
                             f"{', '.join(pf.schema_arrow.names)}; use --field)")
        for batch in pf.iter_batches(columns=[field], batch_size=4096):
            for t in batch.column(0).to_pylist():
                if t is None:
                    continue
                if not isinstance(t, str):
                    raise InputError(f"{path}: column {field!r} is not a string column")
                yield t
    except InputError:
        raise
    except Exception as e:  # pyarrow's errors for truncated / corrupt files vary by version
        raise InputError(f"{path}: not a readable Parquet file: {e}")


def documents(path, field):
    lower = path.lower()
    if lower.endswith((".jsonl", ".json", ".ndjson")):
        return jsonl_documents(path, field)
    if lower.endswith(".parquet"):
        return parquet_documents(path, field)
    return text_documents(path)


# ---- Output ----


def write_token_file(path, tokens, doc_starts, tok, loss_mask=None):
    """One version 2 file (engine/data/token_file.h). tokens: array('I'); doc_starts: list;
    loss_mask: None or a bytearray of 0/1, one per token."""
    n = len(tokens)
    flags = FLAG_LOSS_MASK if loss_mask is not None else 0
    header = struct.pack("<8sIIQQIii4s32s48s", MAGIC, VERSION, tok.vocab_size, n, len(doc_starts),
                         flags, tok.bos_id, tok.eos_id, bytes(4), tok.fingerprint, bytes(48))
    assert len(header) == HEADER_BYTES
    with open(path, "wb") as f:
        f.write(header)
        tokens.tofile(f)
        if n % 2:
            f.write(bytes(4))
        array("Q", doc_starts).tofile(f)
        if loss_mask is not None:
            f.write(bytes(loss_mask))


class ShardWriter:
    """Cuts one split's token stream into files of at most `limit` tokens (a document longer
    than the room left continues in the next file)."""

    def __init__(self, out_dir, split, limit, tok, masked=False):
        self.out_dir, self.split, self.limit, self.tok = out_dir, split, limit, tok
        self.masked = masked
        self.tokens, self.docs, self.mask = array("I"), [], bytearray()
        self.files, self.total = [], 0

    def add(self, ids, mask=None):
        self.docs.append(len(self.tokens))
        if self.masked:
            assert mask is not None and len(mask) == len(ids)
        while len(self.tokens) + len(ids) > self.limit:
            room = self.limit - len(self.tokens)
            self.tokens.extend(ids[:room])
            ids = ids[room:]
            if self.masked:
                self.mask.extend(mask[:room])
                mask = mask[room:]
            self.flush()
        self.tokens.extend(ids)
        if self.masked:
            self.mask.extend(mask)
        if len(self.tokens) == self.limit:
            self.flush()

    def flush(self):
        if not self.tokens:
            return
        path = os.path.join(self.out_dir, f"{self.split}-{len(self.files):05d}.tok")
        write_token_file(path, self.tokens, self.docs, self.tok,
                         self.mask if self.masked else None)
        self.files.append(path)
        self.total += len(self.tokens)
        self.tokens, self.docs, self.mask = array("I"), [], bytearray()


class Progress:
    """One stderr line, redrawn at most twice a second: documents, tokens, tokens/s."""

    def __init__(self, enabled):
        self.enabled, self.start, self.last = enabled, time.monotonic(), 0.0

    def update(self, docs, tokens, done=False):
        now = time.monotonic()
        if not self.enabled or (now - self.last < 0.5 and not done):
            return
        self.last = now
        rate = tokens / max(now - self.start, 1e-9)
        sys.stderr.write(f"\r{docs:,} documents, {tokens:,} tokens, {rate:,.0f} tokens/s   ")
        if done:
            sys.stderr.write("\n")
        sys.stderr.flush()


def tokenize(tok, inputs, out_dir, field="text", shard_tokens=1 << 27, val_fraction=0.0, seed=0,
             batch_docs=1024, progress=False, sft=False):
    """Tokenizes `inputs` (file paths) into out_dir; returns a summary dict."""
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise InputError(f"{out_dir}: already exists and is not an empty directory")
    tmp = f"{out_dir.rstrip('/')}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        rng = random.Random(seed)
        writers = {"train": ShardWriter(tmp, "train", shard_tokens, tok, sft),
                   "val": ShardWriter(tmp, "val", shard_tokens, tok, sft)}
        bar = Progress(progress)
        ndocs = ntokens = ntrained = 0

        def store(encoded, masks=None):
            nonlocal ndocs, ntokens, ntrained
            for k, ids in enumerate(encoded):
                split = "val" if val_fraction > 0 and rng.random() < val_fraction else "train"
                writers[split].add(ids, masks[k] if masks else None)
                ntokens += len(ids)
                ntrained += sum(masks[k]) if masks else len(ids)
            ndocs += len(encoded)
            bar.update(ndocs, ntokens)

        if sft:
            encoder = SftEncoder(tok)
            for path in inputs:
                for where, obj in sft_records(path):
                    ids, mask = encoder.encode(where, obj)
                    store([ids], [mask])

        # encode_batch releases the GIL: the next batch encodes (on all cores) while this thread
        # reads the input and writes the previous batch's tokens.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = None
            for batch in ([] if sft else _batches(inputs, field, batch_docs)):
                encoding = pool.submit(tok.encode_batch, batch)
                if pending is not None:
                    store(pending.result())
                pending = encoding
            if pending is not None:
                store(pending.result())
        for w in writers.values():
            w.flush()
        bar.update(ndocs, ntokens, done=True)
        if ndocs == 0:
            raise InputError(f"{', '.join(inputs)}: no documents")
        if sft and ntrained == 0:
            raise InputError(f"{', '.join(inputs)}: no token to train (every completion and "
                             f"assistant turn is empty)")
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty, checked above
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    rename = lambda files: [os.path.join(out_dir, os.path.basename(f)) for f in files]
    return {"documents": ndocs, "tokens": ntokens, "trained_tokens": ntrained,
            "train": rename(writers["train"].files), "val": rename(writers["val"].files),
            "train_tokens": writers["train"].total, "val_tokens": writers["val"].total}


def _batches(inputs, field, size):
    """The inputs' documents in lists of `size` (a file's last list may be shorter)."""
    for path in inputs:
        batch = []
        for doc in documents(path, field):
            batch.append(doc)
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch


def main(argv=None):
    ap = argparse.ArgumentParser(prog="ithaca-tokenize", description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="*", help="text / .jsonl / .parquet files or globs")
    ap.add_argument("--input", action="append", default=[], help="an input (repeatable)")
    ap.add_argument("--tokenizer", default="byte",
                    help="a model directory or its tokenizer.json; 'byte' = byte-level")
    ap.add_argument("--output", required=True, help="output directory (must not hold files)")
    ap.add_argument("--field", default="text", help="JSON Lines field / Parquet column")
    ap.add_argument("--shard-tokens", type=int, default=1 << 27,
                    help="tokens per output file at most (default 2^27 = 512 MiB)")
    ap.add_argument("--val-fraction", type=float, default=0.0,
                    help="fraction of documents written to val-*.tok instead")
    ap.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    ap.add_argument("--sft", action="store_true",
                    help="JSON Lines of prompt/completion or chat messages, with a loss mask")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    patterns = a.inputs + a.input
    if not patterns:
        ap.error("no inputs")
    if a.shard_tokens < 1:
        ap.error(f"--shard-tokens must be >= 1, got {a.shard_tokens}")
    if not 0 <= a.val_fraction < 1:
        ap.error(f"--val-fraction must be in [0, 1), got {a.val_fraction}")
    try:
        tok = ByteTokenizer() if a.tokenizer == "byte" else Tokenizer(a.tokenizer)
        files = expand_inputs(patterns)
        start = time.monotonic()
        s = tokenize(tok, files, a.output, field=a.field, shard_tokens=a.shard_tokens,
                     val_fraction=a.val_fraction, seed=a.seed,
                     progress=not a.no_progress and sys.stderr.isatty(), sft=a.sft)
    except (InputError, OSError) as e:
        print(f"ithaca-tokenize: {e}", file=sys.stderr)
        return 1
    secs = time.monotonic() - start
    print(f"{a.output}: {s['tokens']} tokens, {s['documents']} documents from {len(files)} "
          f"files, vocab_size {tok.vocab_size}, tokenizer {tok.path} "
          f"({s['tokens'] / max(secs, 1e-9):.0f} tokens/s)")
    if a.sft:
        print(f"  loss mask: {s['trained_tokens']} of {s['tokens']} tokens trained")
    print(f"  train: {s['train_tokens']} tokens in {len(s['train'])} files")
    if a.val_fraction > 0:
        print(f"  val: {s['val_tokens']} tokens in {len(s['val'])} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
