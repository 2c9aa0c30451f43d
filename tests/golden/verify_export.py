#!/usr/bin/env python3
"""transformers' loss on an Ithaca export, to compare with Ithaca's own (ithaca-model-loss).

Usage: verify_export.py EXPORT_DIR IDS_JSON [--dtype bfloat16|float32|float64] [--device DEV]
                        [--compare ITHACA_LOSS_JSON [--rtol R]]

EXPORT_DIR is what ithaca-export (or a job's checkpoint.export) wrote; IDS_JSON holds
{"input_ids": [...]} (or a bare list). The model is loaded exactly as a user would load it,
AutoModelForCausalLM.from_pretrained(EXPORT_DIR, dtype=...), and scored with labels = input_ids
(transformers shifts them), the convention ithaca-model-loss follows. Prints one JSON object:
{"loss", "tokens", "dtype", "device", "transformers", "torch", "tokenizer"}.

With --dtype float32 (weights widened from the file's dtype) the loss should match
ithaca-model-loss, which computes in f32 on the CPU, to ~1e-5 relative; with bfloat16 (the
default, how the export is meant to be served) to ~1e-2. Needs transformers and torch.
"""
import argparse
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("export_dir")
    p.add_argument("ids_json")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float64"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--compare", help="ithaca-model-loss's JSON output for the same ids")
    p.add_argument("--rtol", type=float, help="tolerance for --compare (relative)")
    args = p.parse_args()

    with open(args.ids_json) as f:
        ids = json.load(f)
    if isinstance(ids, dict):
        ids = ids["input_ids"]
    if len(ids) < 2:
        sys.exit(f"{args.ids_json}: need at least two token ids")

    dtype = getattr(torch, args.dtype)
    # transformers 5 names the argument dtype; 4.x called it torch_dtype.
    major = int(transformers.__version__.split(".")[0])
    kwargs = {"dtype": dtype} if major >= 5 else {"torch_dtype": dtype}
    model = AutoModelForCausalLM.from_pretrained(args.export_dir, **kwargs).to(args.device)
    model.eval()

    # Whether the copied tokenizer files load (a real model's; the tests' stand-ins do not).
    tokenizer = None
    if os.path.exists(os.path.join(args.export_dir, "tokenizer.json")):
        try:
            tokenizer = type(AutoTokenizer.from_pretrained(args.export_dir)).__name__
        except Exception as e:  # reported, not fatal: the loss does not depend on it
            tokenizer = f"does not load: {e}"

    input_ids = torch.tensor([ids], dtype=torch.long, device=args.device)
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[0, :-1].double()
    # The mean next-token cross-entropy in float64, from the model's own logits.
    loss = torch.nn.functional.cross_entropy(logits, input_ids[0, 1:]).item()
    result = {
        "loss": loss,
        "tokens": len(ids) - 1,
        "dtype": args.dtype,
        "device": args.device,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "tokenizer": tokenizer,
    }
    ok = True
    if args.compare:
        with open(args.compare) as f:
            ithaca = json.load(f)
        rtol = args.rtol if args.rtol is not None else (2e-2 if args.dtype == "bfloat16" else 1e-4)
        rel = abs(loss - ithaca["loss"]) / abs(ithaca["loss"])
        ok = rel <= rtol and ithaca["tokens"] == len(ids) - 1
        result.update({"ithaca_loss": ithaca["loss"], "relative_difference": rel, "rtol": rtol,
                       "match": ok})
    print(json.dumps(result))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
