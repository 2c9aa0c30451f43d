"""Writes the golden fixtures of tests/golden with transformers itself.

usage: python make_golden.py [OUT_DIR]    (OUT_DIR defaults to this script's directory)

Needs torch, transformers >= 5 and safetensors, e.g. in a virtualenv outside the repository:
    python3 -m venv /tmp/golden-venv
    /tmp/golden-venv/bin/pip install torch 'transformers>=5' safetensors
    /tmp/golden-venv/bin/python tests/golden/make_golden.py

It writes
  models/NAME/   a tiny random Llama saved by transformers' save_pretrained (config.json in the
                 hub's dialect or transformers 5's, weights in one file or shards + index), and
                 golden.json: token ids, labels, and the loss transformers computes on them
                 after loading that very directory back in float64;
  configs/M.transformers5.json   configs/M.hub.json (the published config.json of a real
                 Llama, committed by hand) loaded and re-saved by transformers 5;
  README.md      what was generated, with the versions used.
The C++ tests (golden_loss_test, config_dialects_test) read these files; they do not need
transformers.
"""
import json
import math
import os
import platform
import shutil
import sys
import tempfile

import safetensors
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
REAL_MODELS = ["llama-3.2-1b", "llama-3.2-3b", "llama-3-8b", "llama-3.1-8b"]

# Each fixture: the model's shape, its RoPE (as transformers 5 spells it), how it is saved.
# llama3 fixtures use an original_max_position_embeddings small enough (with sequences longer
# than it) that the high, medium and low frequency bands all occur; main() checks that.
FIXTURES = [
    dict(name="hub_gqa_tied_llama3", dialect="hub",
         what="GQA (4 query / 2 kv heads), tied embeddings, llama3 RoPE, theta 500000, f32",
         shape=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=160,
                    tie_word_embeddings=True),
         rope=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64),
         dtype=torch.float32, shard=None, seq=96, seed=1),
    dict(name="v5_gqa_untied_llama3", dialect="transformers5",
         what="GQA (4 query / 2 kv heads, head_dim 8), untied, llama3 RoPE, theta 10000, f32",
         shape=dict(hidden_size=32, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                    tie_word_embeddings=False),
         rope=dict(rope_type="llama3", rope_theta=10000.0, factor=16.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64),
         dtype=torch.float32, shard=None, seq=100, seed=2),
    dict(name="v5_mha_untied_default", dialect="transformers5",
         what="MHA (4 heads), untied, default RoPE with theta 500000 only inside "
              "rope_parameters, f32",
         shape=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, vocab_size=120,
                    tie_word_embeddings=False),
         rope=dict(rope_type="default", rope_theta=500000.0),
         dtype=torch.float32, shard=None, seq=64, seed=3),
    dict(name="hub_mha_tied_default_head_dim", dialect="hub",
         what="MHA (4 heads) with head_dim 16 != hidden_size / heads, tied, no rope_scaling, "
              "theta 10000, f32",
         shape=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, head_dim=16, vocab_size=100,
                    tie_word_embeddings=True),
         rope=dict(rope_type="default", rope_theta=10000.0),
         dtype=torch.float32, shard=None, seq=48, seed=4),
    dict(name="v5_gqa_untied_llama3_bf16_sharded", dialect="transformers5",
         what="GQA (4 query / 1 kv head), untied, llama3 RoPE, 3 layers, bf16 weights in shards "
              "behind model.safetensors.index.json",
         shape=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=1, vocab_size=96,
                    tie_word_embeddings=False),
         rope=dict(rope_type="llama3", rope_theta=500000.0, factor=32.0, low_freq_factor=1.0,
                   high_freq_factor=4.0, original_max_position_embeddings=64),
         dtype=torch.bfloat16, shard="40KB", seq=80, seed=5),
]


def build_config(fx, rope):
    return LlamaConfig(**fx["shape"], rope_parameters=dict(rope), rms_norm_eps=1e-5,
                       max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                       attn_implementation="eager")


def randomize(model, seed):
    """Weights well away from the initializer's near-uniform logits, so the loss depends on
    attention (and so on RoPE); RMSNorm weights are random too."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))


def reference_loss(model, ids, labels):
    """transformers' own loss, and the same cross-entropy kept in float64 (transformers'
    ForCausalLMLoss upcasts logits only to float32)."""
    model.eval()
    with torch.no_grad():
        out = model(input_ids=ids[None], labels=labels[None])
        logits = out.logits[0, :-1].to(torch.float64)
        ce = torch.nn.functional.cross_entropy(logits, labels[1:], ignore_index=-100)
    return ce.item(), out.loss.item()


def rope_bands(fx):
    """How many inverse frequencies fall in llama3's high, medium and low bands."""
    r = fx["rope"]
    shape = fx["shape"]
    head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    old = r["original_max_position_embeddings"]
    high_wl, low_wl = old / r["high_freq_factor"], old / r["low_freq_factor"]
    bands = [0, 0, 0]
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * r["rope_theta"] ** (i / head_dim)
        bands[0 if wavelen < high_wl else 2 if wavelen > low_wl else 1] += 1
    return bands


def to_hub_dialect(path):
    """Rewrites a transformers 5 config.json the way transformers 4 wrote it: rope_theta at the
    top level, rope_scaling for llama3 (else null), torch_dtype."""
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    if "dtype" in cfg:
        cfg["torch_dtype"] = cfg.pop("dtype")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def make_fixture(fx, out_dir):
    d = os.path.join(out_dir, "models", fx["name"])
    shutil.rmtree(d, ignore_errors=True)
    torch.manual_seed(fx["seed"])
    model = LlamaForCausalLM(build_config(fx, fx["rope"]))
    randomize(model, fx["seed"])
    model = model.to(fx["dtype"])
    kwargs = {"max_shard_size": fx["shard"]} if fx["shard"] else {}
    model.save_pretrained(d, **kwargs)
    sharded = os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    assert sharded == bool(fx["shard"]), f"{fx['name']}: sharded={sharded}"
    if fx["dialect"] == "hub":
        to_hub_dialect(os.path.join(d, "config.json"))
    with open(os.path.join(d, "config.json")) as f:
        text = f.read()
    assert ("rope_parameters" in text) == (fx["dialect"] == "transformers5"), text

    # The reference: transformers reads the directory just written, in float64.
    loaded = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64,
                                                  attn_implementation="eager")
    got = dict(loaded.config.rope_parameters)
    want = dict(fx["rope"])
    assert got == want, f"{fx['name']}: transformers read rope {got}, meant {want}"

    gen = torch.Generator().manual_seed(100 + fx["seed"])
    vocab = fx["shape"]["vocab_size"]
    ids = torch.randint(0, vocab, (fx["seq"],), generator=gen)
    labels = ids.clone()
    labels[fx["seq"] // 3] = -100  # ignored positions, as a padded or masked batch has
    labels[fx["seq"] // 2] = -100
    loss, hf_loss = reference_loss(loaded, ids, labels)
    assert abs(loss - hf_loss) < 1e-6 * loss, (loss, hf_loss)

    # The test can fail: the same weights with the RoPE settings dropped (theta 10000, no
    # scaling), the silent fallback this guards against, give a clearly different loss.
    wrong_loss = None
    if fx["rope"] != dict(rope_type="default", rope_theta=10000.0):
        wrong = LlamaForCausalLM(build_config(fx, dict(rope_type="default", rope_theta=10000.0)))
        wrong = wrong.to(torch.float64)
        wrong.load_state_dict(loaded.state_dict())
        wrong_loss, _ = reference_loss(wrong, ids, labels)
        assert abs(wrong_loss - loss) > 1e-3 * loss, (fx["name"], loss, wrong_loss)
    if fx["rope"]["rope_type"] == "llama3":
        bands = rope_bands(fx)
        assert all(bands), f"{fx['name']}: llama3 bands (high, medium, low) = {bands}"
        assert fx["seq"] > fx["rope"]["original_max_position_embeddings"]

    golden = {
        "what": fx["what"],
        "config_dialect": fx["dialect"],
        "input_ids": ids.tolist(),
        "labels": labels.tolist(),
        "loss": loss,
        "transformers_reported_loss": hf_loss,
        "loss_with_rope_dropped": wrong_loss,
        "generated_by": "tests/golden/make_golden.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    files = sorted(os.listdir(d))
    size = sum(os.path.getsize(os.path.join(d, n)) for n in files)
    print(f"{fx['name']}: loss {loss!r} (rope dropped: {wrong_loss}), {size} bytes: {files}")
    return dict(fx, loss=loss, files=files, size=size)


def resave_real_configs(out_dir):
    """configs/M.hub.json -> configs/M.transformers5.json through transformers 5's own
    load and save."""
    for m in REAL_MODELS:
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as dst:
            shutil.copy(os.path.join(HERE, "configs", f"{m}.hub.json"),
                        os.path.join(src, "config.json"))
            AutoConfig.from_pretrained(src).save_pretrained(dst)
            with open(os.path.join(dst, "config.json")) as f:
                text = f.read()
            assert '"rope_parameters"' in text and '"rope_scaling"' not in text, text
            with open(os.path.join(out_dir, "configs", f"{m}.transformers5.json"), "w") as f:
                f.write(text)
        print(f"configs/{m}.transformers5.json")


README = """# Golden checks against transformers

Generated by `make_golden.py` (this directory) with transformers {transformers}, torch {torch},
safetensors {safetensors}, Python {python}. Regenerate with that script (see its docstring);
the tests read the committed files and do not need transformers.

## models/: tiny checkpoints saved by transformers, and the loss it computes

Each directory is what `LlamaForCausalLM.save_pretrained` wrote for a tiny Llama with random
weights (matrices ~ N(0, 0.25²), RMSNorm weights 1 + N(0, 0.3²)), plus `golden.json`: token
ids, labels (transformers' convention: unshifted, -100 ignored) and `loss`, the mean
cross-entropy of the logits transformers computes after loading that very directory with
`from_pretrained(dtype=torch.float64)`. `loss_with_rope_dropped` is the loss of the same weights
with theta 10000 and no scaling: what a trainer that ignored the RoPE keys would see.
`golden_loss_test` loads each directory as a job spec's `model.config` / `model.weights` would
and checks Ithaca's step-0 loss (CPU, f32) within 1e-5 relative.

| fixture | config dialect | what | loss | bytes |
|---|---|---|---|---|
{rows}

The llama3 fixtures use an `original_max_position_embeddings` of 64 with longer sequences, so
their inverse frequencies fall in all three of llama3's bands (high, medium, low).

## configs/: real models' config.json in both dialects

`M.hub.json` is the config.json Meta published on the Hugging Face hub for Llama-3.2-1B,
Llama-3.2-3B, Meta-Llama-3-8B and Llama-3.1-8B (rope_theta + rope_scaling), written from the
published values; `M.transformers5.json` is that file loaded and re-saved by transformers
{transformers} (`AutoConfig.from_pretrained` + `save_pretrained`: rope_parameters, theta inside).
`config_dialects_test` checks both give the same LlamaConfig, equal to the published shape.

The other families (Qwen3, Qwen2, Mistral) and linear / yarn RoPE have fixtures of their own,
`models/family_*`, made by `make_family_golden.py` and described in `README_families.md`.
"""


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    assert int(transformers.__version__.split(".")[0]) >= 5, transformers.__version__
    torch.use_deterministic_algorithms(True)
    os.makedirs(os.path.join(out_dir, "configs"), exist_ok=True)
    results = [make_fixture(fx, out_dir) for fx in FIXTURES]
    resave_real_configs(out_dir)
    rows = "\n".join(
        f"| `{r['name']}` | {r['dialect']} | {r['what']} | {r['loss']:.6f} | {r['size']} |"
        for r in results)
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(README.format(transformers=transformers.__version__, torch=torch.__version__,
                              safetensors=safetensors.__version__,
                              python=platform.python_version(), rows=rows))


if __name__ == "__main__":
    main()
