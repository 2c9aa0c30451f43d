"""An independent PyTorch (float64) Llama: checks Ithaca's loss and every parameter gradient.

usage: /usr/bin/python3 llama_reference.py DIR
DIR holds model/config.json, model/model.safetensors and grads.safetensors (dump_model_grads).
Written from the Hugging Face Llama definition (rotate_half RoPE, llama3 rope_scaling, GQA by
repeating K/V heads, SwiGLU MLP, RMSNorm in float), not from Ithaca's code. A packed sample
(doc_starts in grads.safetensors) gets what Hugging Face's packing does: position_ids restarting
at each document and a block-diagonal causal mask.
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file


def inv_freq(cfg):
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = cfg["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.get("rope_scaling")
    if rs:
        assert rs.get("rope_type", rs.get("type")) == "llama3"
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
        inv = torch.where(medium, smoothed, inv_l)
    return inv


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def forward(cfg, p, ids, labels, doc_starts=None):
    d = cfg["hidden_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or d // hq
    eps = cfg["rms_norm_eps"]
    S = ids.shape[0]
    doc = torch.zeros(S, dtype=torch.int64)  # each token's document
    for start in (doc_starts or [])[1:]:
        doc[start:] += 1
    first = torch.tensor([(doc == doc[i]).nonzero()[0].item() for i in range(S)])
    position_ids = torch.arange(S) - first
    freqs = torch.outer(position_ids.float(), inv_freq(cfg)).double()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    x = p["model.embed_tokens.weight"][ids]
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    mask = mask.masked_fill(doc[:, None] != doc[None, :], float("-inf"))
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(S, hq, D)
        k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(S, hkv, D)
        v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(S, hkv, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(D) + mask
        o = torch.einsum("hst,thd->shd", scores.softmax(-1), v).reshape(S, hq * D)
        x = x + o @ p[pre + "self_attn.o_proj.weight"].T
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        a = torch.nn.functional.silu(h @ p[pre + "mlp.gate_proj.weight"].T) * (
            h @ p[pre + "mlp.up_proj.weight"].T)
        x = x + a @ p[pre + "mlp.down_proj.weight"].T
    h = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else p["lm_head.weight"]
    logits = h @ head.T
    return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-1)


def main(d):
    cfg = json.load(open(f"{d}/model/config.json"))
    weights = {k: v.double().requires_grad_() for k, v in load_file(f"{d}/model/model.safetensors").items()}
    ith = load_file(f"{d}/grads.safetensors")
    ids = ith["inputs"].long()
    labels = ith["labels"].long()
    docs = [int(v) for v in ith["doc_starts"].tolist()] if "doc_starts" in ith else None
    loss = forward(cfg, weights, ids, labels, docs)
    loss.backward()
    failures = 0
    ref_loss, got_loss = loss.item(), ith["loss"].item()
    print(f"loss: torch {ref_loss:.6f} ithaca {got_loss:.6f}")
    if abs(ref_loss - got_loss) > 1e-4 * max(1.0, abs(ref_loss)):
        print("FAIL loss")
        failures += 1
    expected = set(weights)
    ith.pop("doc_starts", None)
    if cfg["tie_word_embeddings"]:
        expected.discard("lm_head.weight")
    for name in sorted(expected):
        ref = weights[name].grad
        got = ith[name].double()
        scale = ref.abs().max().item()
        err = (ref - got).abs().max().item()
        ok = err <= 2e-4 * scale + 1e-7 and scale > 0
        if not ok:
            failures += 1
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max|ref| {scale:.3e} max|err| {err:.3e}")
    print(f"{len(expected)} gradients checked, {failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(sys.argv[1])
