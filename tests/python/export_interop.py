"""An Ithaca export read by the PyPI `safetensors` package and torch, not by Ithaca.

Usage: export_interop.py <bf16 export dir> <f32 export dir>

Both directories come from ithaca-export on the same checkpoint. Every shard is opened with
safetensors' own loader; every tensor must be where the index says, of the dtype config.json's
torch_dtype names, of the shape config.json implies; the index's total_size must be the sum of
the tensors' bytes; and each bf16 tensor must equal its f32 twin rounded by torch.
"""
import json
import os
import sys

import torch
from safetensors import safe_open

BF16_DIR, F32_DIR = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def expected_shapes(cfg):
    """Every tensor of a Llama checkpoint, as transformers names and shapes them."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": [cfg["vocab_size"], h], "model.norm.weight": [h]}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = [cfg["vocab_size"], h]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
            p + "self_attn.q_proj.weight": [q, h],
            p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h],
            p + "self_attn.o_proj.weight": [h, q],
            p + "mlp.gate_proj.weight": [inter, h],
            p + "mlp.up_proj.weight": [inter, h],
            p + "mlp.down_proj.weight": [h, inter],
        })
    return shapes


def load(path):
    """{name: tensor} read shard by shard through the index (or model.safetensors)."""
    directory = path
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[cfg["torch_dtype"]]
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        weight_map = index["weight_map"]
    else:
        index, weight_map = None, None
    files = sorted(set(weight_map.values())) if weight_map else ["model.safetensors"]
    tensors, where = {}, {}
    for name in files:
        with safe_open(os.path.join(directory, name), framework="pt") as f:
            for key in f.keys():
                check(key not in tensors, f"{os.path.basename(directory)}: {key} in one shard only")
                tensors[key] = f.get_tensor(key)
                where[key] = name
    shapes = expected_shapes(cfg)
    check(set(tensors) == set(shapes),
          f"{os.path.basename(directory)}: the tensors are the model's ({len(tensors)} of {len(shapes)})")
    for key, t in sorted(tensors.items()):
        check(t.dtype == dtype, f"{os.path.basename(directory)}: {key} is {t.dtype} (config says {dtype})")
        check(list(t.shape) == shapes.get(key), f"{os.path.basename(directory)}: {key} has shape {list(t.shape)}")
    if weight_map is not None:
        check(weight_map == where, f"{os.path.basename(directory)}: the index names each tensor's shard")
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        check(index["metadata"]["total_size"] == total,
              f"{os.path.basename(directory)}: index total_size {index['metadata']['total_size']} == {total}")
    return cfg, tensors, files


cfg16, bf16, files16 = load(BF16_DIR)
cfg32, f32, _ = load(F32_DIR)
check(len(files16) >= 3, f"the bf16 export is sharded ({len(files16)} files)")
check(cfg16["torch_dtype"] == "bfloat16" and cfg32["torch_dtype"] == "float32", "torch_dtype")
del cfg16["torch_dtype"], cfg32["torch_dtype"]
check(cfg16 == cfg32, "the two configs differ only in torch_dtype")
for key in sorted(f32):
    rounded = f32[key].to(torch.bfloat16)
    check(torch.equal(bf16[key].view(torch.int16), rounded.view(torch.int16)),
          f"{key}: bf16 export == torch's rounding of the f32 export, bit for bit")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
