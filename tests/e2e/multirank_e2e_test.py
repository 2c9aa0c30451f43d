"""world = 4 through ithacad: four ithaca-worker processes join over Gloo (FileStore rendezvous
the daemon creates per job), every rank reports every step; killing rank 2 fails the job naming
it, and the other three ranks are killed. A packed SFT job (data.document_mask and
data.loss_mask, tokenized by ithaca-tokenize --sft) trains over a Ulysses group of two."""
import json
import os
import re
import signal
import subprocess
import sys
import unittest

import harness
from harness import TMP, Daemon, job_pb2, spec_toml, wait_gone
from ithaca_client import Step

PARALLEL = "[parallel]\nworld = 4\nsp = 4\n"


class MultiRankE2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = Daemon(os.path.join(TMP, "state"), cpu_slots=4)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def test_four_ranks_train_and_report(self):
        job = self.d.submit(spec_toml(os.path.join(TMP, "w4"), steps=10, extra=PARALLEL))
        events = self.d.events(job.id, timeout=300)
        final = self.d.get(job.id)
        self.assertEqual(final.state, job_pb2.JOB_STATE_SUCCEEDED, final.reason)
        for rank in range(4):
            steps = [e.step for e in events if isinstance(e, Step) and e.rank == rank]
            self.assertEqual(steps, list(range(1, 11)), rank)
        self.assertEqual(sorted(s.rank for s in final.last_steps), [0, 1, 2, 3])

    def test_packed_sft_job_over_ulysses(self):
        # Sentences of the corpus as prompt (first half) / completion (the rest) pairs.
        with open(os.environ["ITHACA_CORPUS"], encoding="utf-8") as f:
            sentences = [s.strip() for s in re.split(r"[.\n]", f.read()) if len(s.strip()) > 8]
        src = os.path.join(TMP, "sft.jsonl")
        with open(src, "w") as f:
            for s in sentences:
                f.write(json.dumps({"prompt": s[:len(s) // 2], "completion": s[len(s) // 2:]})
                        + "\n")
        out = os.path.join(TMP, "sft_tokens")
        subprocess.run([sys.executable, "tools/tokenize/ithaca_tokenize.py", "--sft",
                        "--no-progress", "--output", out, src], check=True, capture_output=True)
        spec = spec_toml(os.path.join(TMP, "sft"), steps=6,
                         extra="[parallel]\nworld = 2\nsp = 2\n")
        spec = spec.replace(harness.make_corpus(), os.path.join(out, "train-*.tok"))
        spec = spec.replace("seq_len = 64\n", "seq_len = 64\ndocument_mask = true\n"
                            "loss_mask = true\n")
        job = self.d.submit(spec)
        events = list(self.d.jobs.WatchJob(job_pb2.WatchJobRequest(id=job.id), timeout=300))
        final = self.d.get(job.id)
        self.assertEqual(final.state, job_pb2.JOB_STATE_SUCCEEDED, final.reason)
        losses = [e.step.loss for e in events if e.HasField("step") and e.step.rank == 0]
        self.assertEqual(len(losses), 6)
        self.assertTrue(all(0 < l < 10 for l in losses), losses)

    def test_killing_one_rank_fails_the_job_and_stops_the_others(self):
        job = self.d.submit(spec_toml(os.path.join(TMP, "w4k"), steps=100000, extra=PARALLEL))
        self.d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=1)
        pids = self.d.workers(job.id)
        self.assertEqual(len(pids), 4)
        def rank_of(pid):
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            return int(env[b"ITHACA_RANK"])

        victim = [p for p in pids if rank_of(p) == 2]
        os.kill(victim[0], signal.SIGKILL)
        done = self.d.wait(job.id, timeout=30)
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        self.assertEqual(done.failed_rank, 2)
        self.assertIn("rank 2", done.reason)
        self.assertTrue(wait_gone(self.d.real_state_dir, job.id, timeout=2))
        self.assertTrue(self.d.serving())


if __name__ == "__main__":
    unittest.main(verbosity=2)
