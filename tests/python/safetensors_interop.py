"""Interop between Ithaca's safetensors reader/writer and the PyPI `safetensors` package.

Usage: safetensors_interop.py <path to safetensors_tool>

Python writes files (numpy and torch, bf16 included) that the tool dumps; the tool writes files
(single and sharded) that Python loads. Every comparison is on raw bits, with the expected bf16
rounding computed independently by torch.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file as np_save
from safetensors.torch import load_file as torch_load
from safetensors.torch import save_file as torch_save

TOOL = os.path.abspath(sys.argv[1])
TMP = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True)


def dump(path):
    r = tool("dump", path)
    if r.returncode != 0:
        raise RuntimeError(f"dump {path} failed: {r.stderr}")
    return json.loads(r.stdout)


def bits_of(t):
    """Raw bits of a torch tensor as a flat list of Python ints (the tool's dump format)."""
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.float32:
        return [int(x) for x in t.view(torch.int32).numpy().view(np.uint32)]
    if t.dtype == torch.bfloat16:
        return [int(x) & 0xFFFF for x in t.view(torch.int16).numpy()]
    if t.dtype == torch.int32:
        return [int(x) for x in t.numpy()]
    raise ValueError(t.dtype)


DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int32: "i32"}


def matches(dumped, expected):
    """dumped: the tool's "tensors" object; expected: name -> torch tensor."""
    if sorted(dumped) != sorted(expected):
        return False
    for name, t in expected.items():
        d = dumped[name]
        if d["dtype"] != DTYPES[t.dtype] or d["shape"] != list(t.shape) or d["bits"] != bits_of(t):
            print(f"     mismatch in {name}: {d} vs {t}")
            return False
    return True


def known_tensors():
    """What `safetensors_tool write` writes (mirrors KnownTensors in safetensors_tool.cc)."""
    embed = torch.tensor([(i - 5) * 0.375 for i in range(12)], dtype=torch.float32)
    embed[3] = -0.0
    embed[7] = 1e-40
    norm = torch.tensor([1.00390625, 1.01171875, 3.14159265, -2.5e-3, 65504.0, 1e30, 3.4e38,
                         np.float32(-1.0) / np.float32(3.0)], dtype=torch.float32)
    return {
        "embed.weight": embed.reshape(3, 4),
        "norm.weight": norm.to(torch.bfloat16),  # torch rounds to nearest even, as Ithaca must
        "direct.bf16": torch.tensor([1.0, -5.0], dtype=torch.bfloat16),
        "ids": torch.tensor([-2**31, -1, 0, 1, 2**31 - 1], dtype=torch.int32),
        "scalar": torch.tensor(42.5, dtype=torch.float32),
        "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
    }


def same_tensors(a, b):
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and bits_of(a[k]) == bits_of(b[k])
        for k in a)


# ---- Python writes, Ithaca reads.
rng = np.random.default_rng(7)
np_tensors = {
    "model.layers.0.mlp.up_proj.weight": rng.standard_normal((5, 7)).astype(np.float32),
    "b": np.array([1.5, -0.0, np.inf, -np.inf, 1e-45], dtype=np.float32),
    "tokens": rng.integers(-2**31, 2**31 - 1, size=(2, 3), dtype=np.int32),
    "z.empty": np.zeros((4, 0), dtype=np.float32),
}
path = os.path.join(TMP, "numpy.safetensors")
np_save(np_tensors, path, metadata={"format": "np", "note": "from python"})
d = dump(path)
check(matches(d["tensors"], {k: torch.from_numpy(v) for k, v in np_tensors.items()}),
      "numpy-written f32/i32 file reads back bit-identical")
check(d["metadata"] == {"format": "np", "note": "from python"}, "numpy-written metadata")

torch_tensors = {
    "w.bf16": torch.randn(9, 5, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16),
    "odd.bf16": torch.randn(3, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16),
    "w.f32": torch.randn(4, 4, generator=torch.Generator().manual_seed(5)),
    "scalar": torch.tensor(2.0),
}
path = os.path.join(TMP, "torch.safetensors")
torch_save(torch_tensors, path, metadata={"format": "pt"})
check(matches(dump(path)["tensors"], torch_tensors),
      "torch-written bf16/f32 file reads back bit-identical")

# A sharded set as transformers lays it out, with files from the Python package.
shard_dir = os.path.join(TMP, "py_sharded")
os.makedirs(shard_dir)
torch_save({"w.bf16": torch_tensors["w.bf16"]},
           os.path.join(shard_dir, "model-00001-of-00002.safetensors"))
torch_save({"w.f32": torch_tensors["w.f32"]},
           os.path.join(shard_dir, "model-00002-of-00002.safetensors"))
with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": 154},
               "weight_map": {"w.bf16": "model-00001-of-00002.safetensors",
                              "w.f32": "model-00002-of-00002.safetensors"}}, f)
check(matches(dump(shard_dir)["tensors"],
              {k: torch_tensors[k] for k in ("w.bf16", "w.f32")}),
      "Python-written shards + index load")

# A dtype Ithaca does not read: a clear error naming the tensor and the dtype, no crash.
path = os.path.join(TMP, "f16.safetensors")
np_save({"ok": np.ones(2, np.float32), "half.weight": np.ones(3, np.float16)}, path)
r = tool("dump", path)
check(r.returncode == 1 and "half.weight" in r.stderr and "F16" in r.stderr,
      f"F16 file is refused by name (stderr: {r.stderr.strip()})")

# ---- Ithaca writes, Python reads.
path = os.path.join(TMP, "ithaca.safetensors")
r = tool("write", path)
check(r.returncode == 0, f"tool write ({r.stderr.strip()})")
check(same_tensors(torch_load(path), known_tensors()),
      "Ithaca-written file loads in torch bit-identical")
with safe_open(path, framework="pt") as f:
    check(f.metadata() == {"format": "pt", "producer": "ithaca"}, "Ithaca-written metadata")
loaded_np = {}
with safe_open(path, framework="np") as f:
    for k in f.keys():
        if f.get_slice(k).get_dtype() != "BF16":  # numpy has no bfloat16
            loaded_np[k] = f.get_tensor(k)
check(np.array_equal(loaded_np["ids"], known_tensors()["ids"].numpy()), "i32 via numpy")

# The layout the reference writer produces: 8-byte-aligned header padded with spaces, sorted keys,
# data offsets contiguous from 0 and aligned to each tensor's element size.
with open(path, "rb") as f:
    raw = f.read()
n = struct.unpack("<Q", raw[:8])[0]
header_text = raw[8:8 + n].decode()
header = json.loads(header_text)
keys = list(header)
stripped = header_text.rstrip(" ")
check(n % 8 == 0 and stripped.endswith("}") and len(header_text) - len(stripped) < 8,
      "header length multiple of 8, padded with spaces")
check(keys == sorted(keys), f"header keys sorted ({keys})")
spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
check(spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
      and spans[-1][1] == len(raw) - 8 - n, "data offsets contiguous and cover the buffer")
sizes = {"F32": 4, "I32": 4, "BF16": 2}
check(all(v["data_offsets"][0] % sizes[v["dtype"]] == 0
          for k, v in header.items() if k != "__metadata__"),
      "every tensor aligned to its element size")
check(not [p for p in os.listdir(TMP) if ".tmp." in p], "no temporary files left behind")

# Sharded export: transformers' layout, loaded by hand as transformers does.
out_dir = os.path.join(TMP, "ithaca_sharded")
r = tool("write-sharded", out_dir, "40")
check(r.returncode == 0, f"tool write-sharded ({r.stderr.strip()})")
with open(os.path.join(out_dir, "model.safetensors.index.json")) as f:
    index = json.load(f)
shards = sorted(set(index["weight_map"].values()))
check(len(shards) >= 2 and shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                                      for i in range(1, len(shards) + 1)], f"shard names {shards}")
check(sorted(os.listdir(out_dir)) == sorted(shards + ["model.safetensors.index.json"]),
      "only shards and index in the export directory")
merged = {}
for s in shards:
    merged.update(torch_load(os.path.join(out_dir, s)))
check(same_tensors(merged, known_tensors()), "sharded export loads in torch bit-identical")
check(all(index["weight_map"][k] in shards for k in merged)
      and len(index["weight_map"]) == len(merged),
      "weight_map names every tensor's shard")
check(index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in merged.values()),
      "total_size is the sum of tensor bytes")

# Big limit: one model.safetensors, no index.
one_dir = os.path.join(TMP, "ithaca_one")
r = tool("write-sharded", one_dir, str(1 << 30))
check(r.returncode == 0 and os.listdir(one_dir) == ["model.safetensors"], "single-shard export")
check(same_tensors(torch_load(os.path.join(one_dir, "model.safetensors")), known_tensors()),
      "single-shard export loads in torch")

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
