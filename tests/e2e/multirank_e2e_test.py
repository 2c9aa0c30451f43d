"""world = 4 through ithacad: four ithaca-worker processes join over Gloo (FileStore rendezvous
the daemon creates per job), every rank reports every step; killing rank 2 fails the job naming
it, and the other three ranks are killed."""
import os
import signal
import unittest

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
