"""[retry]: a job whose rank is killed, with max_restarts = 1, is queued again, resumes from its
newest checkpoint and ends with exactly the final loss of the same job run without the kill; the
restart is in its transitions, `restarts`, and ithaca_job_restarts_total. A failure that would
repeat (here: its data file is gone, a bad spec) is not retried."""
import os
import shutil
import signal
import unittest

from prometheus_client.parser import text_string_to_metric_families

from harness import TMP, Daemon, job_pb2, make_corpus, spec_toml

STEPS = 30


def job_toml(run, data=None, retry=""):
    toml = spec_toml(run, steps=STEPS, resume=True, checkpoint_every=5,
                     extra="[parallel]\nworld = 2\n" + retry)
    if data:
        toml = toml.replace(f'path = "{make_corpus()}"', f'path = "{data}"')
    return toml


def final_loss(job):
    return [s.loss for s in job.last_steps if s.rank == 0 and s.step == STEPS][0]


def restarts_metric(daemon):
    for family in text_string_to_metric_families(daemon.metrics_text()):
        if family.name == "ithaca_job_restarts":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError("no ithaca_job_restarts_total")


class RetryE2E(unittest.TestCase):
    def test_a_killed_rank_restarts_from_the_checkpoint_with_the_same_final_loss(self):
        d = Daemon(os.path.join(TMP, "state"), cpu_slots=2)
        reference = d.submit(job_toml(os.path.join(TMP, "run_reference")))
        # Queued behind the reference job; its data file is gone by the time it runs.
        data = os.path.join(TMP, "doomed.tok")
        shutil.copy(make_corpus(), data)
        doomed = d.submit(job_toml(os.path.join(TMP, "run_doomed"), data=data,
                                   retry="[retry]\nmax_restarts = 2\nbackoff_seconds = 0\n"))
        os.unlink(data)
        reference = d.wait(reference.id, timeout=240)
        self.assertEqual(reference.state, job_pb2.JOB_STATE_SUCCEEDED, reference.reason)
        self.assertEqual(reference.restarts, 0)

        doomed = d.wait(doomed.id, timeout=120)
        self.assertEqual(doomed.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("exited with code 2 (bad job spec)", doomed.reason)
        self.assertEqual(doomed.restarts, 0)  # it would fail the same way again
        self.assertEqual(restarts_metric(d), 0)

        job = d.submit(job_toml(os.path.join(TMP, "run_retried"),
                                retry="[retry]\nmax_restarts = 1\nbackoff_seconds = 0.5\n"))
        d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=12)
        rank1 = [p for p in d.workers(job.id)
                 if b"ITHACA_RANK=1" in open(f"/proc/{p}/environ", "rb").read().split(b"\0")]
        os.kill(rank1[0], signal.SIGKILL)
        done = d.wait(job.id, timeout=240)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertEqual(done.restarts, 1)
        restart = [t for t in done.transitions if t.to == job_pb2.JOB_STATE_QUEUED][-1]
        self.assertRegex(restart.reason,
                         r"^restart 1 of 1 in 0.5 s, from .*step-000000(1[0-9]|[2-9][0-9]); "
                         r"after: rank 1 killed by SIGKILL")
        states = [t.to for t in done.transitions]
        self.assertEqual(states.count(job_pb2.JOB_STATE_STARTING), 2, states)
        self.assertNotIn(job_pb2.JOB_STATE_FAILED, states)
        log = open(os.path.join(d.real_state_dir, "jobs", job.id, "rank-0.log")).read()
        self.assertRegex(log, r"resumed from .*step-000000(1[0-9]|[2-9][0-9])")
        # Exact resume: the same losses as the run nothing interrupted.
        self.assertEqual(final_loss(done), final_loss(reference))
        self.assertEqual(restarts_metric(d), 1)
        d.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
