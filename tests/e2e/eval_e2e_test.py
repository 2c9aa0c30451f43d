"""[eval] end to end: a training job's evaluations stream in WatchJob after their steps, the
newest is Job.last_eval (kept across a daemon restart), `ithaca status` and `--follow` show it,
and /metrics has ithaca_eval_loss; an evaluation-only job (training.steps = 0) evaluates the
checkpoint it resumes from and succeeds; eval data that is missing or of another vocabulary is
an error naming eval.path; eval.position_buckets splits the loss by position in the events,
status, the worker's log, /metrics, TensorBoard and the report."""
import glob
import json
import os
import struct
import unittest

import grpc
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import TMP, Daemon, job_pb2, spec_toml
from ithaca_client import Eval, IthacaError, Step

EVAL = """[eval]
path = "{path}"
every = {every}
batches = 2
"""


def eval_only_toml(name, path, checkpoint_dir):
    """Evaluates the newest checkpoint in `checkpoint_dir` on `path`; no training data."""
    return f"""name = "{name}"
backend = "cpu"
[model]
preset = "tiny"
[data]
seq_len = 64
[training]
steps = 0
lr = 0
[memory]
recompute = "full"
tile_tokens = 32
[checkpoint]
dir = "{checkpoint_dir}"
resume = true
""" + EVAL.format(path=path, every=0)


class EvalE2E(unittest.TestCase):
    def setUp(self):
        self.state = os.path.join(TMP, "state")
        self.d = Daemon(self.state)

    def tearDown(self):
        self.d.stop()

    def run_dir(self, name):
        path = os.path.join(TMP, name)
        os.makedirs(path, exist_ok=True)
        return path

    def test_train_with_eval_then_evaluate_the_checkpoint(self):
        run = self.run_dir("train_eval")
        corpus = harness.make_corpus()
        steps = 8
        job = self.d.submit(spec_toml(run, steps=steps, checkpoint_every=4,
                                      extra=EVAL.format(path=corpus, every=4)))
        events = self.d.events(job.id, timeout=120)
        self.assertEqual(events[-1].to_state, job_pb2.JOB_STATE_SUCCEEDED)
        # Each evaluation comes right after the step it follows: every 4 steps, the last once.
        order = [("step", e.step) if isinstance(e, Step) else ("eval", e.step)
                 for e in events if isinstance(e, (Step, Eval))]
        self.assertEqual(order, [("step", s) for s in range(1, 5)] + [("eval", 4)] +
                         [("step", s) for s in range(5, 9)] + [("eval", 8)])
        evals = [e.report for e in events if isinstance(e, Eval)]
        for e in evals:
            self.assertEqual(e.rank, 0)
            self.assertEqual(e.tokens, 2 * 64)  # batches x micro_batch x seq_len
            self.assertEqual(e.batches, 2)
            self.assertGreater(e.seconds, 0)
            self.assertGreater(e.loss, 0)
        self.assertLess(evals[1].loss, evals[0].loss)  # training on the same text helps

        final = self.d.get(job.id)
        self.assertEqual(final.state, job_pb2.JOB_STATE_SUCCEEDED, final.reason)
        self.assertTrue(final.HasField("last_eval"))
        self.assertEqual(final.last_eval, evals[1])

        fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
        mine = [s for s in fams["ithaca_eval_loss"].samples if s.labels.get("job_id") == job.id]
        self.assertEqual(len(mine), 1)
        self.assertEqual(mine[0].labels["rank"], "0")
        self.assertNotIn("gpu", mine[0].labels)  # a CPU slot is no GPU (issue 54 F9)
        self.assertNotIn("UUID", mine[0].labels)
        self.assertAlmostEqual(mine[0].value, evals[1].loss, places=9)

        log = self.d.cli("logs", job.id, "--rank", "0", check=True).stdout
        self.assertIn("eval step 4: loss ", log)
        self.assertIn("eval step 8: loss ", log)
        self.assertIn(f"eval step 8: loss {evals[1].loss:.4f}", self.d.cli("status", job.id,
                                                                         check=True).stdout)

        # Kept across a daemon restart, like the last steps.
        self.d.stop()
        self.d = Daemon(self.state)
        self.assertEqual(self.d.get(job.id).last_eval, evals[1])

        # An evaluation-only job on the checkpoint the job left: the same weights, the same
        # windows, the same loss; the CLI's --follow prints the eval line.
        spec = os.path.join(run, "eval_only.toml")
        with open(spec, "w") as f:
            f.write(eval_only_toml("eval-only", corpus, os.path.join(run, "checkpoints")))
        r = self.d.cli("submit", spec, "--follow")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn(f"eval step {steps}: loss {evals[1].loss:.4f}", r.stdout)
        # Once: the worker's own eval line is not shown beside the eval event's.
        self.assertEqual(r.stdout.count(f"eval step {steps}: loss"), 1, r.stdout)
        self.assertIn("SUCCEEDED", r.stdout)
        only = self.d.get(r.stdout.split()[1])
        self.assertEqual(only.state, job_pb2.JOB_STATE_SUCCEEDED, only.reason)
        self.assertEqual(len(only.last_steps), 0)
        self.assertEqual(only.last_eval.step, steps)
        self.assertAlmostEqual(only.last_eval.loss, evals[1].loss, places=6)
        self.assertEqual(only.last_eval.tokens, evals[1].tokens)

    def test_loss_by_position_everywhere(self):
        run = self.run_dir("positions")
        corpus = harness.make_corpus()
        extra = EVAL.format(path=corpus, every=2) + "position_buckets = [16, 40]\n"
        toml = spec_toml(run, steps=4, checkpoint_every=4, extra=extra)
        job = self.d.submit(toml.replace("[metrics]\n", "[metrics]\ntensorboard = true\n"))
        events = self.d.events(job.id, timeout=120)
        self.assertEqual(events[-1].to_state, job_pb2.JOB_STATE_SUCCEEDED)
        evals = [e.report for e in events if isinstance(e, Eval)]
        self.assertEqual([e.step for e in evals], [2, 4])
        for e in evals:
            # Two windows of 64: positions [0, 16), [16, 40), [40, 64) of each.
            self.assertEqual([(b.begin, b.end, b.tokens) for b in e.positions],
                             [(0, 16, 32), (16, 40, 48), (40, 64, 48)])
            whole = sum(b.loss * b.tokens for b in e.positions) / e.tokens
            self.assertAlmostEqual(whole, e.loss, delta=1e-6 * e.loss)
            self.assertTrue(all(b.loss > 0 for b in e.positions))
        last = evals[1]

        status = json.loads(self.d.cli("status", job.id, "-o", "json", check=True).stdout)
        got = status["last_eval"]["positions"]
        self.assertEqual([(b["begin"], b["end"], b["tokens"]) for b in got],
                         [(b.begin, b.end, b.tokens) for b in last.positions])
        for j, b in zip(got, last.positions):
            self.assertAlmostEqual(j["loss"], b.loss, places=12)
        text = self.d.cli("status", job.id, check=True).stdout
        self.assertIn(f"    by position: [0, 16) {last.positions[0].loss:.4f}, [16, 40) ", text)
        log = self.d.cli("logs", job.id, "--rank", "0", check=True).stdout
        self.assertIn(f"eval step 4 by position: [0, 16) {last.positions[0].loss:.4f}", log)

        fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
        mine = {(s.labels["begin"], s.labels["end"]): s.value
                for s in fams["ithaca_eval_position_loss"].samples
                if s.labels.get("job_id") == job.id}
        self.assertEqual(len(mine), 3, mine)
        for b in last.positions:
            self.assertAlmostEqual(mine[(str(b.begin), str(b.end))], b.loss, places=9)

        data = b""
        for name in glob.glob(os.path.join(run, "checkpoints", "tensorboard",
                                           "events.out.tfevents.*")):
            with open(name, "rb") as f:
                data += f.read()
        for tag in (b"eval/position/0-16", b"eval/position/16-40", b"eval/position/40-64"):
            self.assertIn(tag, data)

        out = os.path.join(run, "report.html")
        self.d.cli("report", job.id, "--out", out, check=True)
        with open(out) as f:
            page = f.read()
        self.assertIn("Eval loss by position", page)
        self.assertIn('data-series="positions [40, 64)"', page)

    def test_bad_eval_data_names_eval_path(self):
        run = self.run_dir("bad_eval")
        missing = os.path.join(run, "missing.tok")
        with self.assertRaises(IthacaError) as e:
            self.d.submit(spec_toml(run, steps=2, extra=EVAL.format(path=missing, every=0)))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(f"eval.path: {missing}: no such file or directory", e.exception.details())

        # A version 1 token file of a 100000-token vocabulary: the tiny model has 258.
        wide = os.path.join(run, "wide.tok")
        tokens = list(range(200)) * 2
        with open(wide, "wb") as f:
            f.write(b"ITHACATK" + struct.pack("<IIQ8x", 1, 100000, len(tokens)))
            f.write(struct.pack(f"<{len(tokens)}I", *tokens))
        # Refused at submit, as the workers would refuse it, before the job takes a slot.
        with self.assertRaises(IthacaError) as e:
            self.d.submit(spec_toml(run, steps=2, extra=EVAL.format(path=wide, every=0)))
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(f"eval.path: {wide}: the file's vocab_size 100000 exceeds the model's "
                      "vocab_size 258", e.exception.details())


if __name__ == "__main__":
    unittest.main()
