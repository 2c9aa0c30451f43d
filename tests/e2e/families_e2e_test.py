"""Every model family through ithacad: a checkpoint that transformers saved (tests/golden/models)
is imported, trains over two CPU ranks with held-out evaluations, and is exported at the end.

The oracle is independent of Ithaca: the export (config.json and f32 safetensors) is read by
the float64 PyTorch model of tests/torch_reference/llama_reference.py, written from the Hugging
Face definitions, and its loss on the evaluation's windows must be the job's last eval loss.
An evaluation-only job that imports the export back must get that loss too (the round trip).

Families and layouts: Qwen3 with YaRN and GQA 4/1 under FSDP over two data-parallel ranks
(its one KV head cannot be split by Ulysses); Qwen2.5-style q/k/v biases with tied embeddings
in the hub dialect, Qwen2 with use_sliding_window (a window of 6 keys on its last two of three
layers), and Mistral with a sliding window of 7 keys, each over a Ulysses group of two; Llama with
linear RoPE over Ulysses."""
import json
import os
import shutil
import struct
import sys
import unittest

import harness
from harness import TMP, Daemon, job_pb2
from ithaca_client import Eval, Step

sys.path.insert(0, os.path.join(os.getcwd(), "tests", "torch_reference"))
import torch  # noqa: E402  (Debian's python3-torch, visible in .venv)
from safetensors.torch import load_file  # noqa: E402
import llama_reference  # noqa: E402

GOLDEN = os.path.join(os.getcwd(), "tests", "golden", "models")
SEQ_LEN = 64
EVAL_BATCHES = 2
STEPS = 6

# (golden model, model_type, [parallel] world, sp, the class transformers instantiates for it)
FAMILIES = {
    "qwen3": ("family_qwen3_v5_yarn", "qwen3", 2, 1, "Qwen3ForCausalLM"),
    "qwen2": ("family_qwen2_hub_tied", "qwen2", 2, 2, "Qwen2ForCausalLM"),
    "qwen2-window-layers": ("family_qwen2_hub_window_layers", "qwen2", 2, 2, "Qwen2ForCausalLM"),
    "mistral": ("family_mistral_v5_window", "mistral", 2, 2, "MistralForCausalLM"),
    "llama": ("family_llama_hub_linear", "llama", 2, 2, "LlamaForCausalLM"),
}


def token_file(path, vocab):
    """The demo corpus's bytes folded into `vocab` ids, as a version 1 token file."""
    with open(os.environ["ITHACA_CORPUS"], "rb") as f:
        tokens = [b % vocab for b in f.read()]
    with open(path, "wb") as f:
        f.write(b"ITHACATK" + struct.pack("<IIQ8x", 1, vocab, len(tokens)))
        f.write(struct.pack(f"<{len(tokens)}I", *tokens))
    return tokens


def job_toml(name, config, weights, data, world, sp, steps, checkpoint_dir, export):
    return f"""name = "{name}"
backend = "cpu"
[model]
config = "{config}"
weights = "{weights}"
[data]
path = "{data}"
seq_len = {SEQ_LEN}
[training]
steps = {steps}
lr = 3e-3
warmup_steps = 2
[parallel]
world = {world}
sp = {sp}
[memory]
recompute = "full"
tile_tokens = 32
[checkpoint]
dir = "{checkpoint_dir}"
every = 0
resume = false
export = "{export}"
[eval]
path = "{data}"
every = 3
batches = {EVAL_BATCHES}
"""


def reference_loss(export_dir, tokens, windows):
    """The mean cross-entropy of the float64 reference over the first `windows` windows."""
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    weights = {k: v.double() for k, v in load_file(
        os.path.join(export_dir, "model.safetensors")).items()}
    total = 0.0
    with torch.no_grad():
        for w in range(windows):
            window = torch.tensor(tokens[w * SEQ_LEN: w * SEQ_LEN + SEQ_LEN + 1])
            total += llama_reference.forward(cfg, weights, window[:-1], window[1:]).item()
    return total / windows, cfg


class FamiliesE2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(os.path.join(TMP, "state"), cpu_slots=4)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def check_family(self, family):
        golden, model_type, world, sp, architecture = FAMILIES[family]
        run = os.path.join(TMP, family)
        model = os.path.join(run, "model")
        shutil.copytree(os.path.join(GOLDEN, golden), model)
        with open(os.path.join(model, "config.json")) as f:
            source = json.load(f)
        tokens = token_file(os.path.join(run, "tokens.tok"), source["vocab_size"])

        spec = job_toml(family, os.path.join(model, "config.json"),
                        os.path.join(model, "model.safetensors"),
                        os.path.join(run, "tokens.tok"), world, sp, STEPS,
                        os.path.join(run, "checkpoints"), "f32")
        job = self.d.submit(spec)
        events = self.d.events(job.id, timeout=300)
        final = self.d.get(job.id)
        self.assertEqual(final.state, job_pb2.JOB_STATE_SUCCEEDED, final.reason)
        steps = [e for e in events if isinstance(e, Step) and e.rank == 0]
        self.assertEqual([s.step for s in steps], list(range(1, STEPS + 1)))
        evals = [e.report for e in events if isinstance(e, Eval)]
        self.assertEqual([e.step for e in evals], [3, 6])
        self.assertLess(evals[1].loss, evals[0].loss)  # training on the same text helps
        replicas = world // sp
        self.assertEqual(evals[1].tokens, EVAL_BATCHES * replicas * SEQ_LEN)

        # The family's own config.json, read by an independent model: the last eval's loss.
        export = os.path.join(run, "checkpoints", "export")
        ref, cfg = reference_loss(export, tokens, EVAL_BATCHES * replicas)
        self.assertEqual(cfg["model_type"], model_type)
        self.assertEqual(cfg["architectures"], [architecture])
        keys = ["head_dim", "tie_word_embeddings", "num_key_value_heads"]
        # A window's keys as the source states them when it has one; without, any spelling of
        # none will do (the export writes use_sliding_window false, sliding_window null).
        if source.get("use_sliding_window") or model_type == "mistral":
            keys += ["sliding_window", "use_sliding_window", "max_window_layers"]
        for key in keys:
            if key in source:
                self.assertEqual(cfg.get(key), source[key], key)
        print(f"{family}: eval losses {evals[0].loss:.6f} -> {evals[1].loss:.6f}; the export "
              f"scored by the reference: {ref:.6f}")
        self.assertAlmostEqual(ref, evals[1].loss, delta=1e-4 * ref,
                               msg=f"{family}: reference {ref} vs ithacad {evals[1].loss}")

        # The export imported back by an evaluation-only job: the same loss.
        spec = job_toml(family + "-reimport", os.path.join(export, "config.json"), export,
                        os.path.join(run, "tokens.tok"), world, sp, 0,
                        os.path.join(run, "eval_only"), "")
        job = self.d.submit(spec)
        self.d.events(job.id, timeout=300)
        again = self.d.get(job.id)
        self.assertEqual(again.state, job_pb2.JOB_STATE_SUCCEEDED, again.reason)
        self.assertAlmostEqual(again.last_eval.loss, evals[1].loss, delta=1e-5 * ref)
        return ref, evals[1].loss

    def test_qwen3_yarn_fsdp(self):
        self.check_family("qwen3")

    def test_qwen2_biases_tied_ulysses(self):
        self.check_family("qwen2")

    def test_qwen2_window_layers_ulysses(self):
        self.check_family("qwen2-window-layers")

    def test_mistral_window_ulysses(self):
        self.check_family("mistral")

    def test_llama_linear_rope_ulysses(self):
        self.check_family("llama")


if __name__ == "__main__":
    unittest.main()
