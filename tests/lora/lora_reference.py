"""An independent PyTorch (float64) LoRA fine-tune: checks Ithaca's LoRA trajectory.

usage: python lora_reference.py LLAMA_REFERENCE_PY DIR
DIR (lora_trajectory) holds model/ (the base), adapter_start/ and adapter_trained/ (PEFT adapter
directories), and run.safetensors (each step's sample, and Ithaca's loss and gradient norm).
The model is tests/torch_reference/llama_reference.py's rotary embedding and norms with LoRA on
every linear as PEFT defines it (y = x W^T + (lora_alpha / r) (x A^T) B^T), trained with
torch.optim.AdamW on the adapters alone (weight decay 0.1, betas 0.9 / 0.95, eps 1e-8, lr 1e-2)
after clipping their gradient norm to 1; the base is never given to the optimizer.
"""
import importlib.util
import json
import math
import sys

import torch
from safetensors.torch import load_file

spec = importlib.util.spec_from_file_location("llama_reference", sys.argv[1])
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
d = sys.argv[2]

cfg = json.load(open(f"{d}/model/config.json"))
acfg = json.load(open(f"{d}/adapter_start/adapter_config.json"))
scale = acfg["lora_alpha"] / acfg["r"]
base = {k: v.double() for k, v in load_file(f"{d}/model/model.safetensors").items()}
prefix = "base_model.model."
adapters = {k[len(prefix):]: v.double().clone().requires_grad_(True)
            for k, v in load_file(f"{d}/adapter_start/adapter_model.safetensors").items()}
run = load_file(f"{d}/run.safetensors")


def lin(x, name):
    y = x @ base[name + ".weight"].T
    a = adapters.get(name + ".lora_A.weight")
    if a is not None:
        y = y + scale * (x @ a.T) @ adapters[name + ".lora_B.weight"].T
    return y


def loss_of(ids):
    S = ids.shape[0]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = ref.head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    inv, att = ref.inv_freq(cfg)
    freqs = torch.outer(torch.arange(S).float(), inv).double()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :] * att, emb.sin()[:, None, :] * att
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    x = base["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        h = ref.rms_norm(x, base[pre + "input_layernorm.weight"], eps)
        q = lin(h, pre + "self_attn.q_proj").view(S, hq, D)
        k = lin(h, pre + "self_attn.k_proj").view(S, hkv, D)
        v = lin(h, pre + "self_attn.v_proj").view(S, hkv, D)
        q = q * cos + ref.rotate_half(q) * sin
        k = k * cos + ref.rotate_half(k) * sin
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(D) + mask
        o = torch.einsum("hst,thd->shd", scores.softmax(-1), v).reshape(S, hq * D)
        x = x + lin(o, pre + "self_attn.o_proj")
        h = ref.rms_norm(x, base[pre + "post_attention_layernorm.weight"], eps)
        a = torch.nn.functional.silu(lin(h, pre + "mlp.gate_proj")) * lin(h, pre + "mlp.up_proj")
        x = x + lin(a, pre + "mlp.down_proj")
    h = ref.rms_norm(x, base["model.norm.weight"], eps)
    head = base["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else base["lm_head.weight"]
    logits = h @ head.T
    return torch.nn.functional.cross_entropy(logits[:-1], ids[1:])


params = list(adapters.values())
opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
samples = run["samples"].long()
bad = []
for step in range(samples.shape[0]):
    opt.zero_grad()
    loss = loss_of(samples[step])
    loss.backward()
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params))
    clip = min(1.0, 1.0 / norm.item())
    for p in params:
        p.grad.mul_(clip)
    opt.step()
    ours, our_norm = run["losses"][step].item(), run["grad_norms"][step].item()
    print(f"step {step + 1}: loss {loss.item():.6f} (ithaca {ours:.6f}), grad norm "
          f"{norm.item():.6f} (ithaca {our_norm:.6f})")
    if abs(ours - loss.item()) > 2e-4 * max(1.0, abs(loss.item())):
        bad.append(f"step {step + 1} loss")
    if abs(our_norm - norm.item()) > 1e-3 * max(1.0, norm.item()):
        bad.append(f"step {step + 1} grad norm")

trained = load_file(f"{d}/adapter_trained/adapter_model.safetensors")
assert set(trained) == {prefix + k for k in adapters}, "the trained adapter's keys"
for k, v in adapters.items():
    ours = trained[prefix + k].double()
    err = (ours - v.detach()).abs().max().item()
    if err > 1e-3 * max(1.0, v.abs().max().item()):
        bad.append(f"{k}: max |diff| {err:.3g}")
moved = sum((trained[prefix + k].double() -
             load_file(f"{d}/adapter_start/adapter_model.safetensors")[prefix + k].double())
            .abs().max().item() > 1e-3 for k in adapters)
if moved < len(adapters):
    bad.append(f"only {moved} of {len(adapters)} adapter tensors moved in training")
if bad:
    print("MISMATCH:", "; ".join(bad))
    sys.exit(1)
print(f"ok: {samples.shape[0]} steps, {len(adapters)} adapter tensors match")
