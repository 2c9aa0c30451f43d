"""An independent PyTorch (float64) Llama, Qwen2, Qwen3 or Mistral: checks Ithaca's loss and every
parameter gradient.

usage: /usr/bin/python3 llama_reference.py DIR
DIR holds model/config.json, model/model.safetensors and grads.safetensors (dump_model_grads).
Written from the Hugging Face definitions (rotate_half RoPE; llama3, linear and yarn rope scaling,
yarn's attention factor on cos and sin; GQA by repeating K/V heads; SwiGLU MLP; RMSNorm in float;
Qwen2's q/k/v biases; Qwen3's per-head q_norm/k_norm before RoPE; Mistral's sliding window, where
query i sees keys j with i - window < j <= i, and Qwen2/Qwen3's on the layers from max_window_layers
on), not from Ithaca's code. A packed sample (doc_starts
in grads.safetensors) gets what Hugging Face's packing does: position_ids restarting at each
document and a block-diagonal causal mask.
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def inv_freq(cfg):
    """(inverse frequencies, attention factor) of the config's rope."""
    dim = head_dim(cfg)
    base = cfg["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv, 1.0
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "linear":
        return inv / rs["factor"], 1.0
    if kind == "yarn":
        # YaRN (arXiv 2309.00071): frequency index d turns r(d) = L / (2 pi base^(2d/dim)) times over
        # the original context L; indices that turn more than beta_fast times keep their
        # frequency, fewer than beta_slow are divided by factor, a linear ramp in between.
        factor = rs["factor"]
        L = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        def index_of(turns):
            return dim * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = index_of(fast), index_of(slow)
        if rs.get("truncate", True):
            lo, hi = math.floor(lo), math.ceil(hi)
        lo, hi = max(lo, 0), min(hi, dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
        keep = 1 - ramp  # 1: the frequency unchanged
        freqs = base ** (torch.arange(0, dim, 2).float() / dim)
        inv = (1.0 / (factor * freqs)) * (1 - keep) + (1.0 / freqs) * keep
        att = rs.get("attention_factor")
        if att is None:
            att = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return inv, att
    assert kind == "llama3", kind
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old = rs["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / inv
    inv_l = torch.where(wavelen > low_wl, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, inv_l), 1.0


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def layer_windows(cfg):
    """Each layer's sliding window (None: full causal). Mistral: sliding_window on every layer.
    Qwen2/Qwen3: only with use_sliding_window, on the layers layer_types marks
    "sliding_attention", which by default are those from max_window_layers (28) on; the window
    defaults to 4096."""
    family = cfg.get("model_type", "llama")
    layers = cfg["num_hidden_layers"]
    if family == "mistral":
        return [cfg.get("sliding_window")] * layers
    if family not in ("qwen2", "qwen3"):
        return [None] * layers
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window") else None
    kinds = cfg.get("layer_types") or [
        "sliding_attention" if window is not None and i >= cfg.get("max_window_layers", 28)
        else "full_attention" for i in range(layers)]
    return [window if k == "sliding_attention" else None for k in kinds]


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def forward(cfg, p, ids, labels, doc_starts=None):
    d = cfg["hidden_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = head_dim(cfg)
    eps = cfg["rms_norm_eps"]
    family = cfg.get("model_type", "llama")
    windows = layer_windows(cfg)
    S = ids.shape[0]
    doc = torch.zeros(S, dtype=torch.int64)  # each token's document
    for start in (doc_starts or [])[1:]:
        doc[start:] += 1
    first = torch.tensor([(doc == doc[i]).nonzero()[0].item() for i in range(S)])
    position_ids = torch.arange(S) - first
    inv, att = inv_freq(cfg)
    freqs = torch.outer(position_ids.float(), inv).double()
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None, :] * att, emb.sin()[:, None, :] * att
    x = p["model.embed_tokens.weight"][ids]
    causal = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    causal = causal.masked_fill(doc[:, None] != doc[None, :], float("-inf"))
    for l in range(cfg["num_hidden_layers"]):
        mask = causal
        if windows[l]:
            i = torch.arange(S)
            mask = causal.masked_fill(i[None, :] <= i[:, None] - windows[l], float("-inf"))
        pre = f"model.layers.{l}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = h @ p[pre + "self_attn.q_proj.weight"].T
        k = h @ p[pre + "self_attn.k_proj.weight"].T
        v = h @ p[pre + "self_attn.v_proj.weight"].T
        if family == "qwen2":
            q = q + p[pre + "self_attn.q_proj.bias"]
            k = k + p[pre + "self_attn.k_proj.bias"]
            v = v + p[pre + "self_attn.v_proj.bias"]
        q, k, v = q.view(S, hq, D), k.view(S, hkv, D), v.view(S, hkv, D)
        if family == "qwen3":
            q = rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps)
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
    family = cfg.get("model_type", "llama")
    extras = [n for n in expected if n.endswith("_proj.bias") or "_norm.weight" in n and "self_attn" in n]
    want = {"qwen2": 3, "qwen3": 2}.get(family, 0) * cfg["num_hidden_layers"]
    if len(extras) != want:
        print(f"FAIL {family}: {len(extras)} bias/norm tensors, expected {want}")
        failures += 1
    ith.pop("doc_starts", None)
    if cfg["tie_word_embeddings"]:
        expected.discard("lm_head.weight")
    for name in sorted(expected):
        ref = weights[name].grad
        got = ith[name].double()
        scale = ref.abs().max().item()
        err = (ref - got).abs().max().item()
        # A window of one key makes every softmax a constant 1: q and k get no gradient at all.
        zero_ok = cfg.get("sliding_window") == 1 and any(
            t in name for t in ("q_proj", "k_proj", "q_norm", "k_norm"))
        ok = err <= 2e-4 * scale + 1e-7 and (scale > 0 or zero_ok)
        if not ok:
            failures += 1
        print(f"{'ok  ' if ok else 'FAIL'} {name}: max|ref| {scale:.3e} max|err| {err:.3e}")
    print(f"{len(expected)} gradients checked, {failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main(sys.argv[1])
