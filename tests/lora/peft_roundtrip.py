"""PEFT and Ithaca on one LoRA adapter, both ways, the loss compared.

usage: python peft_roundtrip.py ITHACA_MODEL_LOSS DIR
DIR (lora_trajectory) holds model/ (a tiny Llama in Hugging Face layout) and adapter_trained/
(the adapters Ithaca trained, written as a PEFT directory, as checkpoint.export writes it).
1. peft.PeftModel.from_pretrained(base, adapter_trained) in transformers gives the loss that
   ithaca-model-loss --lora computes, and it is not the base's loss (the adapter matters).
2. An adapter made and saved by peft itself (get_peft_model, non-zero B, three targets, another
   rank and alpha) gives in ithaca-model-loss --lora (Ithaca's [lora] init reader) the loss peft
   computes.
"""
import importlib.metadata as metadata
import json
import subprocess
import sys

import torch

# transformers 4.44 is the newest that runs on Debian's torch 1.13; it pins tokenizers < 0.20 at
# import, where the project's .venv has 0.23 (tools/tokenize). Nothing here tokenizes: the check
# is told 0.19 for the import alone.
_version = metadata.version
metadata.version = lambda name: "0.19.1" if name == "tokenizers" else _version(name)
import transformers  # noqa: E402

metadata.version = _version
import peft  # noqa: E402

model_loss, d = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
vocab = json.load(open(f"{d}/model/config.json"))["vocab_size"]
ids = torch.randint(0, vocab, (45,))
ids_json = f"{d}/ids.json"
json.dump({"input_ids": ids.tolist()}, open(ids_json, "w"))


def base_model():
    return transformers.LlamaForCausalLM.from_pretrained(
        f"{d}/model", torch_dtype=torch.float32, attn_implementation="eager").eval()


def torch_loss(m):
    with torch.no_grad():
        return m(input_ids=ids[None], labels=ids[None]).loss.item()


def ithaca_loss(*extra):
    out = subprocess.run([model_loss, f"{d}/model", ids_json, *extra], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["loss"]


bad = []


def compare(what, ours, theirs, tol=2e-5):
    print(f"{what}: ithaca {ours:.7f}, peft {theirs:.7f}")
    if abs(ours - theirs) > tol * max(1.0, abs(theirs)):
        bad.append(f"{what}: ithaca {ours} vs peft {theirs}")


# 1. Ithaca's adapter in peft.
m = peft.PeftModel.from_pretrained(base_model(), f"{d}/adapter_trained")
cfg = m.peft_config["default"]
assert cfg.r == 4 and cfg.lora_alpha == 8, cfg
assert sorted(cfg.target_modules) == sorted(
    ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]), cfg
adapted = torch_loss(m)
with m.disable_adapter():
    plain = torch_loss(m)
compare("the trained adapter", ithaca_loss("--lora", f"{d}/adapter_trained"), adapted)
compare("the base alone", ithaca_loss(), plain)
if abs(adapted - plain) < 1e-3:
    bad.append(f"the adapter changes the loss by only {abs(adapted - plain)}")

# 2. peft's adapter in Ithaca.
made = peft.get_peft_model(base_model(), peft.LoraConfig(
    r=2, lora_alpha=5, lora_dropout=0.0, target_modules=["q_proj", "o_proj", "up_proj"],
    init_lora_weights=False))
made.save_pretrained(f"{d}/peft_made")
theirs = torch_loss(made)
compare("peft's own adapter", ithaca_loss("--lora", f"{d}/peft_made"), theirs)
if abs(theirs - plain) < 1e-3:
    bad.append("peft's adapter does not change the loss")

if bad:
    print("MISMATCH:", "; ".join(bad))
    sys.exit(1)
print("ok")
