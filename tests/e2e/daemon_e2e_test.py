"""ithacad end to end (world 1): train with streamed steps, metrics and checkpoints; the CLI;
cancel; a worker killed with SIGKILL; a worker that stops heart-beating; bad specs."""
import json
import os
import signal
import threading
import time
import unittest

import grpc
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import TMP, Daemon, job_pb2, spec_toml, wait_gone
from ithaca_client import IthacaError, Snapshot, StateChange, Step


class DaemonE2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(os.path.join(TMP, "state"))

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        assert cls.d.proc.returncode == 0, cls.d.proc.returncode

    def run_dir(self, name):
        path = os.path.join(TMP, name)
        os.makedirs(path, exist_ok=True)
        return path

    def test_train_streams_every_step_exports_metrics_and_checkpoints(self):
        run = self.run_dir("train")
        steps = 20
        job = self.d.submit(spec_toml(run, steps=steps))
        self.assertEqual(job.state, job_pb2.JOB_STATE_QUEUED)
        events = self.d.events(job.id, timeout=120)
        # The stream starts with a snapshot, carries every step of rank 0 once, and ends with
        # the terminal state.
        self.assertIsInstance(events[0], Snapshot)
        got = [e.step for e in events if isinstance(e, Step)]
        self.assertEqual(got, list(range(1, steps + 1)))
        states = [e.to_state for e in events if isinstance(e, StateChange)]
        self.assertEqual(states[-3:], [job_pb2.JOB_STATE_STARTING, job_pb2.JOB_STATE_RUNNING,
                                       job_pb2.JOB_STATE_SUCCEEDED])
        self.assertIsInstance(events[-1], StateChange)
        self.assertEqual(events[-1].to_state, job_pb2.JOB_STATE_SUCCEEDED)
        seqs = [e.seq for e in events[1:]]
        self.assertEqual(seqs, sorted(seqs))

        final = self.d.get(job.id)
        self.assertEqual(final.state, job_pb2.JOB_STATE_SUCCEEDED, final.reason)
        self.assertEqual(final.last_steps[0].step, steps)
        self.assertEqual([t.to for t in final.transitions],
                         [job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_STARTING,
                          job_pb2.JOB_STATE_RUNNING, job_pb2.JOB_STATE_SUCCEEDED])
        ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
        self.assertIn("step-00000020", ckpts)
        for f in ("state.json", "optimizer.safetensors", "model"):
            self.assertTrue(os.path.exists(os.path.join(run, "checkpoints", "step-00000020", f)))
        self.assertEqual(self.d.workers(job.id), [])

        # /metrics through prometheus_client's own parser.
        fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
        mine = lambda fam: [s for s in fams[fam].samples if s.labels.get("job") == job.id]
        mem = {s.labels["tier"]: s.value for s in mine("ithaca_gpu_memory_bytes")}
        for tier in ("params", "grads", "optimizer"):  # held between steps
            self.assertGreater(mem[tier], 0, tier)
        peak = {s.labels["tier"]: s.value for s in mine("ithaca_gpu_memory_peak_bytes")}
        for tier in ("params", "grads", "optimizer", "attention", "activations", "checkpoints"):
            self.assertGreater(peak[tier], 0, tier)
            self.assertGreaterEqual(peak[tier], mem[tier], tier)
        self.assertEqual(set(mem), {"params", "grads", "optimizer", "attention", "activations",
                                    "checkpoints", "comm", "workspace"})
        tps = mine("ithaca_tokens_per_second")
        self.assertEqual([(s.labels["rank"], s.labels["gpu"]) for s in tps], [("0", "0")])
        self.assertIn("UUID", tps[0].labels)
        self.assertGreater(tps[0].value, 0)
        hist = {s.name: s.value for s in mine("ithaca_step_duration_seconds")
                if s.name.endswith("_count")}
        self.assertEqual(hist["ithaca_step_duration_seconds_count"], steps)
        self.assertEqual([s.value for s in mine("ithaca_train_step")], [steps])
        tokens = [s.value for s in mine("ithaca_tokens")]  # counter family drops _total
        self.assertEqual(tokens, [steps * 64])
        jobs = {s.labels["state"]: s.value for s in fams["ithaca_jobs"].samples}
        self.assertGreaterEqual(jobs["succeeded"], 1)
        exits = {s.labels["reason"]: s.value for s in fams["ithaca_worker_exits"].samples}
        self.assertGreaterEqual(exits["ok"], 1)
        self.assertTrue(self.d.serving())

    def test_cli_submit_follow_status_logs(self):
        run = self.run_dir("cli")
        spec = os.path.join(run, "job.toml")
        # A relative data path: the CLI sends the spec's directory along.
        os.symlink(harness.make_corpus(), os.path.join(run, "corpus.tok"))
        with open(spec, "w") as f:
            f.write(spec_toml(run, steps=8).replace(harness.make_corpus(), "corpus.tok"))
        r = self.d.cli("submit", spec, "--follow")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("step 8/8", r.stdout)
        self.assertIn("SUCCEEDED", r.stdout)
        job_id = r.stdout.split()[1]
        status = json.loads(self.d.cli("--json", "status", job_id, check=True).stdout)
        self.assertEqual(status["state"], "JOB_STATE_SUCCEEDED")
        self.assertEqual(status["spec"]["data_path"], os.path.join(run, "corpus.tok"))
        logs = self.d.cli("logs", job_id, "--rank", "0", check=True).stdout
        self.assertIn("step 5/8 | loss", logs)
        self.assertIn(job_id, self.d.cli("list", check=True).stdout)
        plan = self.d.cli("plan", spec)
        self.assertEqual(plan.returncode, 0, plan.stderr)
        self.assertIn("fits", plan.stdout)
        bad = self.d.cli("status", "job-999")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("NOT_FOUND", bad.stderr)

    def test_cancel_while_running(self):
        run = self.run_dir("cancel")
        job = self.d.submit(spec_toml(run, steps=100000))
        self.d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=2)
        pids = self.d.workers(job.id)
        self.assertEqual(len(pids), 1)
        t0 = time.time()
        r = self.d.client.cancel(job.id, reason="test")
        self.assertIn(r.state, (job_pb2.JOB_STATE_CANCELLING, job_pb2.JOB_STATE_CANCELLED))
        done = self.d.wait(job.id, timeout=10)
        took = time.time() - t0
        self.assertEqual(done.state, job_pb2.JOB_STATE_CANCELLED, done.reason)
        self.assertLess(took, 3 + 1.0)  # the grace period, plus supervision latency
        self.assertTrue(wait_gone(self.d.real_state_dir, job.id, timeout=1))
        with self.assertRaises(IthacaError) as e:
            self.d.client.cancel(job.id)
        self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        print(f"cancel → CANCELLED in {took:.2f} s")

    def test_killed_worker_fails_the_job_naming_the_rank(self):
        job = self.d.submit(spec_toml(self.run_dir("kill"), steps=100000))
        self.d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=1)
        (pid,) = self.d.workers(job.id)
        os.kill(pid, signal.SIGKILL)
        done = self.d.wait(job.id, timeout=10)
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("rank 0", done.reason)
        self.assertIn("signal 9", done.reason)
        self.assertTrue(done.HasField("failed_rank"))
        self.assertEqual(done.failed_rank, 0)
        self.assertTrue(wait_gone(self.d.real_state_dir, job.id, timeout=2))
        self.assertTrue(self.d.serving())
        self.assertEqual(self.d.node().free_slots, 4)

    def test_worker_that_stops_heart_beating_fails_the_job(self):
        job = self.d.submit(spec_toml(self.run_dir("stall"), steps=100000))
        self.d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=1)
        (pid,) = self.d.workers(job.id)
        os.kill(pid, signal.SIGSTOP)
        done = self.d.wait(job.id, timeout=20)
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("rank 0", done.reason)
        self.assertIn("heart-beating", done.reason)
        self.assertEqual(done.failed_rank, 0)
        self.assertTrue(wait_gone(self.d.real_state_dir, job.id, timeout=2))

    def test_bad_specs_are_rejected_naming_the_field(self):
        run = self.run_dir("bad")
        before = len(self.d.client.list())
        cases = [
            (spec_toml(run, extra='colour = "red"\n'), grpc.StatusCode.INVALID_ARGUMENT,
             "colour"),
            (spec_toml(run).replace("lr = 3e-3", "lr = -1.0"),
             grpc.StatusCode.INVALID_ARGUMENT, "training.lr"),
            (spec_toml(run, extra="[parallel]\nworld = 3\nsp = 3\n"),
             grpc.StatusCode.INVALID_ARGUMENT, "parallel.sp"),
            (spec_toml(run).replace('preset = "tiny"', 'preset = "llama-3-8b"'),
             grpc.StatusCode.FAILED_PRECONDITION, "GiB per rank"),
            (spec_toml(run, extra="[parallel]\nworld = 8\nsp = 2\n"),
             grpc.StatusCode.FAILED_PRECONDITION, "parallel.world"),
            ("this is [not toml", grpc.StatusCode.INVALID_ARGUMENT, "job.toml:1"),
        ]
        for toml, code, needle in cases:
            with self.subTest(needle=needle):
                with self.assertRaises(IthacaError) as e:
                    self.d.submit(toml)
                self.assertEqual(e.exception.code(), code, e.exception.details())
                self.assertIn(needle, e.exception.details())
        # Nothing was stored or started.
        jobs = self.d.client.list()
        self.assertEqual(len(jobs), before)
        self.assertEqual(self.d.node().free_slots, 4)
        with self.assertRaises(IthacaError) as e:
            self.d.get("job-12345")
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)


if __name__ == "__main__":
    unittest.main(verbosity=2)
