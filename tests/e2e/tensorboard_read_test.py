"""metrics.tensorboard = true, as a user sees it: a CPU run of ithaca-worker --standalone, then
TensorBoard's own reader (tensorboard.backend.event_processing.event_accumulator) finds every
step's train/loss, train/lr, train/grad_norm, train/tokens_per_second and memory scalars and each
evaluation's eval/loss in checkpoint.dir/tensorboard, equal to what the step and eval lines say.

Args: ithaca-worker, ithaca_tokenize.py, a text corpus."""

import os
import re
import subprocess
import sys
import unittest

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as e:  # the .venv of tools/setup.sh has it (tools/requirements.txt)
    sys.exit(f"tensorboard_read_test: the tensorboard package is missing ({e}); run "
             "bash tools/setup.sh to make .venv, or set ITHACA_PYTHON to a Python that has it")

WORKER, TOKENIZE, CORPUS = sys.argv[1:4]
TMP = os.environ.get("TEST_TMPDIR", "/tmp")
STEPS = 6


class TensorBoardReadTest(unittest.TestCase):
    def test_tensorboard_reads_every_step_and_evaluation(self):
        data = os.path.join(TMP, "data")
        subprocess.run([sys.executable, TOKENIZE, "--tokenizer", "byte", "--output", data,
                        "--val-fraction", "0.2", "--no-progress", CORPUS], check=True)
        ckpt = os.path.join(TMP, "run")
        spec = os.path.join(TMP, "job.toml")
        with open(spec, "w") as f:
            f.write(f"""name = "tb"
backend = "cpu"
[model]
preset = "tiny"
[data]
path = "{data}/train-*.tok"
seq_len = 64
[training]
steps = {STEPS}
lr = 3e-3
warmup_steps = 2
[checkpoint]
dir = "{ckpt}"
[eval]
path = "{data}/val-*.tok"
every = 3
batches = 1
[metrics]
tensorboard = true
""")
        r = subprocess.run([WORKER, "--standalone", spec], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        lines = dict((int(m.group(1)), float(m.group(2))) for m in
                     re.finditer(r"^step (\d+)/\d+ \| loss ([0-9.]+)", r.stdout, re.M))
        evals = dict((int(m.group(1)), float(m.group(2))) for m in
                     re.finditer(r"^eval step (\d+): loss ([0-9.]+)", r.stdout, re.M))
        self.assertEqual(sorted(lines), list(range(1, STEPS + 1)), r.stdout)
        self.assertEqual(sorted(evals), [3, STEPS], r.stdout)

        tb = os.path.join(ckpt, "tensorboard")
        files = [f for f in os.listdir(tb) if f.startswith("events.out.tfevents.")]
        self.assertEqual(len(files), 1, files)
        acc = event_accumulator.EventAccumulator(tb)
        acc.Reload()
        tags = acc.Tags()["scalars"]
        for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_second",
                    "train/step_seconds", "memory/device_peak_gib", "eval/loss"):
            self.assertIn(tag, tags)
        loss = {e.step: e.value for e in acc.Scalars("train/loss")}
        self.assertEqual(sorted(loss), list(range(1, STEPS + 1)))
        for step, value in lines.items():  # the line rounds to 4 decimals; the event is a float
            self.assertAlmostEqual(loss[step], value, delta=6e-5, msg=f"step {step}")
        self.assertEqual(sorted(e.step for e in acc.Scalars("eval/loss")), sorted(evals))
        for e in acc.Scalars("eval/loss"):
            self.assertAlmostEqual(e.value, evals[e.step], delta=6e-5)
        lrs = [e.value for e in acc.Scalars("train/lr")]
        self.assertAlmostEqual(max(lrs), 3e-3, delta=1e-9)  # training.lr, at the warmup's end
        self.assertLess(lrs[-1], max(lrs))  # then the cosine decays
        self.assertTrue(all(e.value > 0 for e in acc.Scalars("memory/device_peak_gib")))
        self.assertTrue(all(e.value > 0 for e in acc.Scalars("train/tokens_per_second")))
        walls = [e.wall_time for e in acc.Scalars("train/loss")]
        self.assertEqual(walls, sorted(walls))
        self.assertGreater(walls[0], 1.7e9)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
