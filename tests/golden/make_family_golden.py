"""Writes the family golden fixtures of tests/golden (Qwen3, Qwen2, Mistral, linear and yarn RoPE)
with transformers itself: models/family_*/.

usage: python make_family_golden.py [OUT_DIR [NAME...]]   (OUT_DIR defaults to this script's
directory; NAMEs: only those fixtures, their README rows printed)

Needs torch, transformers >= 5 and safetensors (see make_golden.py). For each fixture it writes
models/NAME/: what `<Family>ForCausalLM.save_pretrained` saved for a tiny random model (config.json
in the hub's dialect or transformers 5's, model.safetensors), golden.json (token ids, labels in
transformers' convention, `loss`: the float64 cross-entropy of the logits transformers computes
after loading that very directory in float64, and `loss_without_feature`: the loss of the same
weights without what the fixture is about, which must differ), and grads.safetensors: the
gradient of `loss` with respect to every parameter (float64 autograd, stored as float32, under
the parameter's Hugging Face name). family_golden_test reads these files; it does not need
transformers. Then it prints one line per fixture and appends a table to README_families.md.
"""
import json
import math
import os
import platform
import shutil
import sys

import safetensors
import safetensors.torch
import torch
import transformers
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))

FAMILIES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}

# Each fixture: family, shape, RoPE (transformers 5's spelling), extra config keys, and what the
# "without" comparison drops (a config change under which the same weights must load).
FIXTURES = [
    dict(name="family_qwen3_hub_tied", family="qwen3", dialect="hub",
         what="Qwen3: q/k norms, head_dim 24 != hidden / heads, GQA 4/2, tied, default RoPE",
         shape=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=24, vocab_size=160,
                    tie_word_embeddings=True),
         rope=dict(rope_type="default", rope_theta=1000000.0),
         extra=dict(use_sliding_window=False), seq=64, seed=11,
         without=None),
    dict(name="family_qwen3_v5_yarn", family="qwen3", dialect="transformers5",
         what="Qwen3 with YaRN (factor 4 over an original 32 positions), untied, GQA 4/1",
         shape=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=128,
                    tie_word_embeddings=False),
         rope=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                   original_max_position_embeddings=32),
         extra=dict(use_sliding_window=False), seq=96, seed=12,
         without=dict(rope=dict(rope_type="default", rope_theta=1000000.0))),
    dict(name="family_qwen2_hub_tied", family="qwen2", dialect="hub",
         what="Qwen2.5: q/k/v biases, GQA 4/2, tied, use_sliding_window false with a window "
              "stated (ignored)",
         shape=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=150,
                    tie_word_embeddings=True),
         rope=dict(rope_type="default", rope_theta=1000000.0),
         extra=dict(use_sliding_window=False, sliding_window=8, max_window_layers=2),
         seq=64, seed=13, without=None),
    dict(name="family_qwen2_v5_linear", family="qwen2", dialect="transformers5",
         what="Qwen2 with linear RoPE (factor 4), untied, MHA",
         shape=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, vocab_size=100,
                    tie_word_embeddings=False),
         rope=dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
         extra=dict(use_sliding_window=False), seq=48, seed=14,
         without=dict(rope=dict(rope_type="default", rope_theta=10000.0))),
    dict(name="family_qwen2_hub_window_layers", family="qwen2", dialect="hub",
         what="Qwen2 with use_sliding_window true: a window of 6 keys on layers 1 and 2 "
              "(max_window_layers 1), full causal on layer 0; no layer_types in the file",
         shape=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=110,
                    tie_word_embeddings=False),
         rope=dict(rope_type="default", rope_theta=10000.0),
         extra=dict(use_sliding_window=True, sliding_window=6, max_window_layers=1),
         hub_drop=("layer_types",), seq=48, seed=19,
         without=dict(extra=dict(use_sliding_window=False, sliding_window=6,
                                 max_window_layers=1))),
    dict(name="family_qwen3_v5_window_layers", family="qwen3", dialect="transformers5",
         what="Qwen3 with use_sliding_window true: a window of 5 keys on layer 2 only "
              "(max_window_layers 2; layer_types as transformers 5 writes them), GQA 4/2",
         shape=dict(hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=112,
                    tie_word_embeddings=False),
         rope=dict(rope_type="default", rope_theta=1000000.0),
         extra=dict(use_sliding_window=True, sliding_window=5, max_window_layers=2),
         seq=40, seed=20,
         without=dict(extra=dict(use_sliding_window=False, sliding_window=5,
                                 max_window_layers=2))),
    dict(name="family_mistral_v5_window", family="mistral", dialect="transformers5",
         what="Mistral with a sliding window of 7 keys over 64 tokens, GQA 4/2, untied",
         shape=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=120,
                    tie_word_embeddings=False),
         rope=dict(rope_type="default", rope_theta=1000000.0),
         extra=dict(sliding_window=7), seq=64, seed=15,
         without=dict(extra=dict(sliding_window=None))),
    dict(name="family_mistral_hub_nowindow", family="mistral", dialect="hub",
         what="Mistral with sliding_window null (Llama's attention), tied, GQA 4/1",
         shape=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=1, vocab_size=96,
                    tie_word_embeddings=True),
         rope=dict(rope_type="default", rope_theta=10000.0),
         extra=dict(sliding_window=None), seq=40, seed=16, without=None),
    dict(name="family_llama_hub_linear", family="llama", dialect="hub",
         what="Llama with linear RoPE (factor 8), GQA 4/2, untied",
         shape=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=140,
                    tie_word_embeddings=False),
         rope=dict(rope_type="linear", rope_theta=500000.0, factor=8.0),
         extra={}, seq=80, seed=17,
         without=dict(rope=dict(rope_type="default", rope_theta=500000.0))),
    dict(name="family_llama_v5_yarn_explicit", family="llama", dialect="transformers5",
         what="Llama with YaRN: explicit attention_factor 1.3, beta_fast 16, beta_slow 2, "
              "truncate false, original 24 positions",
         shape=dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, vocab_size=130,
                    tie_word_embeddings=True),
         rope=dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, attention_factor=1.3,
                   beta_fast=16.0, beta_slow=2.0, truncate=False,
                   original_max_position_embeddings=24),
         extra={}, seq=96, seed=18,
         without=dict(rope=dict(rope_type="default", rope_theta=10000.0))),
]


def build(fx, rope=None, extra=None):
    config_cls, model_cls = FAMILIES[fx["family"]]
    kwargs = dict(fx["shape"])
    kwargs.update(fx["extra"] if extra is None else extra)
    cfg = config_cls(**kwargs, rope_parameters=dict(rope or fx["rope"]), rms_norm_eps=1e-6,
                     max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                     attn_implementation="eager")
    return model_cls(cfg)


def randomize(model, seed):
    """Matrices and biases ~ N(0, 0.25²); RMSNorm weights (q_norm and k_norm too) 1 + N(0, 0.3²)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))


def loss_of(model, ids, labels):
    """The float64 cross-entropy of transformers' logits (labels unshifted, -100 ignored)."""
    out = model(input_ids=ids[None])
    logits = out.logits[0, :-1].to(torch.float64)
    return torch.nn.functional.cross_entropy(logits, labels[1:], ignore_index=-100)


def to_hub_dialect(path, drop=()):
    """rope_parameters -> rope_theta at the top level and rope_scaling (null for default); the
    keys in `drop` removed (transformers 4's configs had no layer_types)."""
    with open(path) as f:
        cfg = json.load(f)
    for key in drop:
        cfg.pop(key, None)
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
    model = build(fx)
    randomize(model, fx["seed"])
    model.save_pretrained(d)
    if fx["dialect"] == "hub":
        to_hub_dialect(os.path.join(d, "config.json"), fx.get("hub_drop", ()))
    with open(os.path.join(d, "config.json")) as f:
        saved = json.load(f)
    assert ("rope_parameters" in saved) == (fx["dialect"] == "transformers5"), saved
    assert saved["model_type"] == fx["family"], saved

    loaded = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64,
                                                  attn_implementation="eager")
    assert type(loaded).__name__ == FAMILIES[fx["family"]][1].__name__, type(loaded)
    got = dict(loaded.config.rope_parameters)
    for k, v in fx["rope"].items():
        assert got.get(k) == v, f"{fx['name']}: transformers read rope {got}, meant {fx['rope']}"
    if fx["extra"].get("use_sliding_window"):
        # The layers transformers windows: from max_window_layers on.
        want = ["sliding_attention" if i >= fx["extra"]["max_window_layers"] else "full_attention"
                for i in range(fx["shape"]["num_hidden_layers"])]
        assert list(loaded.config.layer_types) == want, (fx["name"], loaded.config.layer_types)
        assert loaded.config.sliding_window == fx["extra"]["sliding_window"], loaded.config
    names = [n for n, _ in loaded.named_parameters()]
    if fx["family"] == "qwen3":
        assert any(n.endswith("q_norm.weight") for n in names), names
    if fx["family"] == "qwen2":
        assert any(n.endswith("q_proj.bias") for n in names), names

    gen = torch.Generator().manual_seed(100 + fx["seed"])
    ids = torch.randint(0, fx["shape"]["vocab_size"], (fx["seq"],), generator=gen)
    labels = ids.clone()
    labels[fx["seq"] // 3] = -100
    labels[fx["seq"] // 2] = -100
    loaded.eval()
    loss = loss_of(loaded, ids, labels)
    loss.backward()
    # Tied embeddings: one tensor (model.embed_tokens.weight) carries both uses' gradient.
    grads = {}
    for n, p in loaded.named_parameters():
        grads[n] = p.grad.detach().to(torch.float32).contiguous()
    safetensors.torch.save_file(grads, os.path.join(d, "grads.safetensors"))
    with torch.no_grad():
        hf_loss = loaded(input_ids=ids[None], labels=labels[None]).loss.item()
    assert abs(loss.item() - hf_loss) < 1e-6 * loss.item(), (loss.item(), hf_loss)

    without = None
    if fx["without"]:
        other = build(fx, rope=fx["without"].get("rope"), extra=fx["without"].get("extra"))
        other = other.to(torch.float64)
        other.load_state_dict(loaded.state_dict())
        other.eval()
        with torch.no_grad():
            without = loss_of(other, ids, labels).item()
        assert abs(without - loss.item()) > 1e-4 * loss.item(), (fx["name"], loss.item(), without)

    golden = {
        "what": fx["what"],
        "family": fx["family"],
        "config_dialect": fx["dialect"],
        "input_ids": ids.tolist(),
        "labels": labels.tolist(),
        "loss": loss.item(),
        "transformers_reported_loss": hf_loss,
        "loss_without_feature": without,
        "generated_by": "tests/golden/make_family_golden.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    files = sorted(os.listdir(d))
    size = sum(os.path.getsize(os.path.join(d, n)) for n in files)
    print(f"{fx['name']}: loss {loss.item()!r} (without: {without}), {size} bytes: {files}")
    return dict(fx, loss=loss.item(), size=size)


README = """# Family golden fixtures (models/family_*)

Generated by `make_family_golden.py` with transformers {transformers}, torch {torch},
safetensors {safetensors}, Python {python}. Each directory holds what
`<Family>ForCausalLM.save_pretrained` wrote for a tiny random model, `golden.json` (token ids,
labels, the float64 loss transformers computes after loading the directory in float64, and the
loss without the fixture's feature) and `grads.safetensors` (transformers' float64 gradient of
that loss for every parameter, stored as f32). `family_golden_test` checks Ithaca's step-0 loss
(CPU, f32) within 1e-5 relative and every gradient within 2e-4 of its tensor's largest entry.

| fixture | family | config dialect | what | loss | bytes |
|---|---|---|---|---|---|
{rows}
"""


def main():
    """[OUT_DIR [NAME...]]: with NAMEs only those fixtures are made, and their README rows are
    printed instead of README_families.md being written."""
    out_dir = sys.argv[1] if len(sys.argv) > 1 else HERE
    only = sys.argv[2:]
    unknown = set(only) - {fx["name"] for fx in FIXTURES}
    assert not unknown, f"no such fixtures: {sorted(unknown)}"
    assert int(transformers.__version__.split(".")[0]) >= 5, transformers.__version__
    torch.use_deterministic_algorithms(True)
    results = [make_fixture(fx, out_dir) for fx in FIXTURES if not only or fx["name"] in only]
    rows = "\n".join(
        f"| `{r['name']}` | {r['family']} | {r['dialect']} | {r['what']} | {r['loss']:.6f} | "
        f"{r['size']} |" for r in results)
    if only:
        print(rows)
        return
    with open(os.path.join(out_dir, "README_families.md"), "w") as f:
        f.write(README.format(transformers=transformers.__version__, torch=torch.__version__,
                              safetensors=safetensors.__version__,
                              python=platform.python_version(), rows=rows))


if __name__ == "__main__":
    main()
