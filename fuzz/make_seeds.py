#!/usr/bin/env python3
"""Writes the binary seeds of fuzz/corpus/safetensors and fuzz/corpus/token_file: small valid
files of every layout the readers accept (the files in tests/ are too large to fuzz quickly)."""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, (dtype, shape, payload) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


def token_v1(tokens, vocab):
    return (b"ITHACATK" + struct.pack("<IIQ8x", 1, vocab, len(tokens)) +
            struct.pack(f"<{len(tokens)}I", *tokens))


def token_v2(tokens, vocab, docs, mask=None, bos=-1, eos=-1, fingerprint=bytes(32)):
    header = (b"ITHACATK" + struct.pack("<IIQQIii4x", 2, vocab, len(tokens), len(docs),
                                        1 if mask is not None else 0, bos, eos) +
              fingerprint + bytes(48))
    assert len(header) == 128
    body = struct.pack(f"<{len(tokens)}I", *tokens)
    body += bytes(-len(body) % 8)
    body += struct.pack(f"<{len(docs)}Q", *docs)
    if mask is not None:
        body += bytes(mask)
    return header + body


def write(sub, name, data):
    os.makedirs(os.path.join(ROOT, sub), exist_ok=True)
    with open(os.path.join(ROOT, sub, name), "wb") as f:
        f.write(data)


f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
write("safetensors", "f32_bf16_i32.safetensors", safetensors({
    "model.embed_tokens.weight": ("F32", [2, 3], f32(1, -2, 3.5, 0, 1e-3, -7)),
    "model.norm.weight": ("BF16", [4], struct.pack("<4H", 0x3F80, 0xBF80, 0x7F80, 0x0001)),
    "step": ("I32", [], struct.pack("<i", 42)),
}, {"format": "pt"}))
write("safetensors", "empty_and_scalar.safetensors", safetensors({
    "empty": ("F32", [0, 5], b""),
    "scalar": ("F32", [], f32(3.0)),
}))
write("safetensors", "no_tensors.safetensors", safetensors({}, {"format": "pt"}))

toks = [256, 72, 105, 10, 256, 66, 121, 101, 10]
write("token_file", "v1.tok", token_v1(toks, 258))
write("token_file", "v1_unknown_vocab.tok", token_v1([5, 0, 2**31], 0))
write("token_file", "v2_byte.tok", token_v2(toks, 258, [0, 4], bos=256))
write("token_file", "v2_mask.tok", token_v2(toks[:8], 258, [0, 4], mask=[0, 1, 1, 1, 0, 0, 1, 1],
                                            bos=256, eos=257, fingerprint=bytes(range(32))))
write("token_file", "v2_split_doc.tok", token_v2([7, 8, 9], 0, [2]))
write("token_file", "v2_empty.tok", token_v2([], 0, []))
