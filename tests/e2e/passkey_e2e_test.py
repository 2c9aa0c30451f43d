"""[eval.passkey] end to end through ithacad: a training job's evaluations carry a passkey point
per (length, depth) in WatchJob, in `ithaca status -o json` (Job.last_eval.passkey) and its text
form, in /metrics (ithaca_passkey_accuracy and ithaca_passkey_logprob per length and depth) and in
TensorBoard; `ithaca report` draws them as the needle-in-a-haystack heatmap; an evaluation-only
job of [eval.passkey] alone scores the job's checkpoint the same; a length longer than
data.seq_len is refused at submit, naming the key; a LoRA job evaluates the same way, and an
evaluation-only job of its [lora] scores its adapters; multi-key points (eval.passkey.keys) come
beside the passkey's in every one of those outputs."""
import glob
import json
import os
import unittest

from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import TMP, Daemon, job_pb2, spec_toml
from ithaca_client import Eval, IthacaError

LENGTHS, DEPTHS, SAMPLES = [128, 256], [0, 0.5, 1], 2

PASSKEY = f"""[eval.passkey]
lengths = {LENGTHS}
depths = {DEPTHS}
samples = {SAMPLES}
"""


class PasskeyE2E(unittest.TestCase):
    def setUp(self):
        self.state = os.path.join(TMP, "state")
        self.d = Daemon(self.state)

    def tearDown(self):
        self.d.stop()

    def check_points(self, report, step):
        self.assertEqual(report.step, step)
        self.assertEqual(report.tokens, 0)  # no eval.path: no held-out loss
        points = [(p.length, p.depth) for p in report.passkey]
        self.assertEqual(points, [(n, d) for n in LENGTHS for d in DEPTHS])
        for p in report.passkey:
            self.assertEqual(p.samples, SAMPLES)
            self.assertGreaterEqual(p.accuracy, 0)
            self.assertLessEqual(p.accuracy, 1)
            self.assertLess(p.logprob, 0)
            self.assertGreater(p.seconds, 0)

    def check_eval_only_scores(self, run, name, want, extra=""):
        """An evaluation-only job of [eval.passkey] (and `extra`) on `run`'s checkpoint of step 4
        gives the points of `want`, that run's last evaluation."""
        only = self.d.submit(f"""name = "{name}"
backend = "cpu"
[model]
preset = "tiny"
[data]
seq_len = 256
[training]
steps = 0
lr = 0
[memory]
recompute = "full"
tile_tokens = 32
[checkpoint]
dir = "{run}/checkpoints"
resume = true
""" + PASSKEY + extra)
        done = self.d.wait(only.id, timeout=180)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.check_points(done.last_eval, 4)
        for a, b in zip(done.last_eval.passkey, want.passkey):
            self.assertEqual(a.accuracy, b.accuracy)
            self.assertAlmostEqual(a.logprob, b.logprob, delta=1e-5 * abs(b.logprob))

    def test_passkey_in_status_metrics_tensorboard_and_report(self):
        run = os.path.join(TMP, "passkey_run")
        os.makedirs(run, exist_ok=True)
        extra = "[eval]\nevery = 2\n" + PASSKEY
        toml = spec_toml(run, steps=4, seq_len=256, checkpoint_every=4, extra=extra)
        toml = toml.replace("[metrics]\n", "[metrics]\ntensorboard = true\n")
        job = self.d.submit(toml)
        events = self.d.events(job.id, timeout=180)
        self.assertEqual(events[-1].to_state, job_pb2.JOB_STATE_SUCCEEDED)
        evals = [e.report for e in events if isinstance(e, Eval)]
        self.assertEqual([e.step for e in evals], [2, 4])
        for e in evals:
            self.check_points(e, e.step)

        # status -o json: the newest evaluation's points, as the event had them.
        r = self.d.cli("status", job.id, "-o", "json", check=True)
        status = json.loads(r.stdout)
        got = status["last_eval"]["passkey"]
        self.assertEqual(len(got), len(LENGTHS) * len(DEPTHS))
        for j, p in zip(got, evals[1].passkey):
            self.assertEqual((j["length"], j["depth"], j["samples"]), (p.length, p.depth, p.samples))
            self.assertAlmostEqual(j["accuracy"], p.accuracy, places=12)
            self.assertAlmostEqual(j["logprob"], p.logprob, places=12)
        text = self.d.cli("status", job.id, check=True).stdout
        self.assertIn("last eval: eval step 4: passkey accuracy ", text)
        self.assertIn("    passkey 256 tokens: depth 0 ", text)

        # The worker's own lines.
        log = self.d.cli("logs", job.id, "--rank", "0", check=True).stdout
        self.assertIn("passkey step 2, 128 tokens: accuracy ", log)
        self.assertIn("passkey step 4, 256 tokens: accuracy ", log)

        # /metrics: a series per (length, depth), the newest values.
        fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
        for name, field in (("ithaca_passkey_accuracy", "accuracy"),
                            ("ithaca_passkey_logprob", "logprob")):
            mine = {(s.labels["length"], s.labels["depth"]): s.value
                    for s in fams[name].samples if s.labels.get("job_id") == job.id}
            self.assertEqual(len(mine), len(LENGTHS) * len(DEPTHS), mine)
            for p in evals[1].passkey:
                self.assertAlmostEqual(mine[(str(p.length), f"{p.depth:g}")], getattr(p, field),
                                       places=9)

        # TensorBoard: each point's scalars.
        files = glob.glob(os.path.join(run, "checkpoints", "tensorboard", "events.out.tfevents.*"))
        self.assertTrue(files)
        data = b""
        for name in files:
            with open(name, "rb") as f:
                data += f.read()
        for n in LENGTHS:
            for d in DEPTHS:
                self.assertIn(f"passkey/{n}/depth_{d:g}/accuracy".encode(), data)

        # The report: the heatmap, a cell per point, with the newest accuracies.
        out = os.path.join(run, "report.html")
        self.d.cli("report", job.id, "--out", out, check=True)
        with open(out) as f:
            page = f.read()
        self.assertEqual(page.count('id="passkey"'), 1)
        self.assertEqual(page.count('<rect class="cell"'), len(LENGTHS) * len(DEPTHS))
        for p in evals[1].passkey:
            self.assertIn(f'data-length="{p.length}" data-depth="{p.depth:g}" '
                          f'data-accuracy="{p.accuracy:g}"', page)
        self.assertIn("Passkey retrieval, step 4", page)

        # An evaluation-only job of [eval.passkey] alone, on the job's checkpoint: the same
        # weights, keys and layout, so the same points.
        self.check_eval_only_scores(run, "passkey-only", evals[1])

    def test_lora_job_evaluates_and_an_eval_only_job_scores_its_adapters(self):
        # Issue 52: a LoRA job through ithacad evaluates passkey as any job does; its steps say
        # how few parameters train; an evaluation-only job of the same [lora] on its checkpoint
        # (the adapters, over the base the run started from) gives the same points.
        run = os.path.join(TMP, "passkey_lora")
        os.makedirs(run, exist_ok=True)
        lora = '[lora]\nrank = 4\nalpha = 8\ntargets = ["q_proj", "v_proj", "down_proj"]\n'
        toml = spec_toml(run, steps=4, seq_len=256, checkpoint_every=4,
                         extra="[eval]\nevery = 2\n" + PASSKEY + lora)
        job = self.d.submit(toml)
        events = self.d.events(job.id, timeout=180)
        self.assertEqual(events[-1].to_state, job_pb2.JOB_STATE_SUCCEEDED)
        evals = [e.report for e in events if isinstance(e, Eval)]
        self.assertEqual([e.step for e in evals], [2, 4])
        for e in evals:
            self.check_points(e, e.step)
        final = self.d.get(job.id)
        step = final.last_steps[0]
        self.assertGreater(step.trainable_parameters, 0)
        self.assertLess(step.trainable_parameters, step.parameters / 10)
        self.check_eval_only_scores(run, "passkey-lora-only", evals[1], extra=lora)

    def test_multikey_points_beside_the_passkey(self):
        run = os.path.join(TMP, "passkey_multikey")
        os.makedirs(run, exist_ok=True)
        extra = "[eval]\nevery = 0\n[eval.passkey]\nlengths = [256]\ndepths = [0, 1]\n" \
                "samples = 2\nkeys = [1, 2]\n"
        toml = spec_toml(run, steps=2, seq_len=256, checkpoint_every=2, extra=extra)
        job = self.d.submit(toml.replace("[metrics]\n", "[metrics]\ntensorboard = true\n"))
        events = self.d.events(job.id, timeout=180)
        self.assertEqual(events[-1].to_state, job_pb2.JOB_STATE_SUCCEEDED)
        evals = [e.report for e in events if isinstance(e, Eval)]
        self.assertEqual(len(evals), 1)
        got = [(p.keys, p.length, p.depth) for p in evals[0].passkey]
        self.assertEqual(got, [(1, 256, 0), (1, 256, 1), (2, 256, 0), (2, 256, 1)])
        for p in evals[0].passkey:
            self.assertEqual(p.samples, 2)
            self.assertLess(p.logprob, 0)

        status = json.loads(self.d.cli("status", job.id, "-o", "json", check=True).stdout)
        self.assertEqual([p["keys"] for p in status["last_eval"]["passkey"]], [1, 1, 2, 2])
        text = self.d.cli("status", job.id, check=True).stdout
        self.assertIn("; 2-key accuracy ", text)
        self.assertIn("    passkey 256 tokens, 2 keys: depth 0 ", text)
        log = self.d.cli("logs", job.id, "--rank", "0", check=True).stdout
        self.assertIn("passkey step 2, 256 tokens, 2 keys: accuracy ", log)

        fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
        mine = {(s.labels.get("keys", "1"), s.labels["depth"]): s.value
                for s in fams["ithaca_passkey_accuracy"].samples
                if s.labels.get("job_id") == job.id}
        self.assertEqual(len(mine), 4, mine)
        for p in evals[0].passkey:
            self.assertAlmostEqual(mine[(str(p.keys), f"{p.depth:g}")], p.accuracy, places=9)

        data = b""
        for name in glob.glob(os.path.join(run, "checkpoints", "tensorboard",
                                           "events.out.tfevents.*")):
            with open(name, "rb") as f:
                data += f.read()
        self.assertIn(b"passkey/256/depth_0/accuracy", data)
        self.assertIn(b"passkey/2_keys/256/depth_1/accuracy", data)

        out = os.path.join(run, "report.html")
        self.d.cli("report", job.id, "--out", out, check=True)
        with open(out) as f:
            page = f.read()
        self.assertEqual(page.count('id="passkey"'), 1)
        self.assertEqual(page.count('id="passkey-2-keys"'), 1)
        self.assertIn("Multi-key retrieval (2 keys, one asked), step 2", page)

    def test_a_length_longer_than_seq_len_is_refused(self):
        run = os.path.join(TMP, "passkey_bad")
        os.makedirs(run, exist_ok=True)
        with self.assertRaises(IthacaError) as e:
            self.d.submit(spec_toml(run, steps=2, seq_len=128, extra=PASSKEY))
        self.assertIn("eval.passkey.lengths: 256 is not in [1, data.seq_len = 128]",
                      str(e.exception))


if __name__ == "__main__":
    unittest.main()
