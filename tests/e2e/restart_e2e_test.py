"""ithacad killed with SIGKILL mid-job, then restarted on the same state directory: the job is
FAILED with its reason (or, when its spec asks to resume and a checkpoint exists, queued again
and resumed from it), its workers are gone, queued jobs run, and the daemon is healthy."""
import os
import time
import unittest

from harness import TMP, Daemon, job_pb2, spec_toml, wait_gone


class RestartE2E(unittest.TestCase):
    def test_daemon_killed_mid_job_then_restarted(self):
        state = os.path.join(TMP, "state")
        run = os.path.join(TMP, "run")
        d = Daemon(state, cpu_slots=1)
        running = d.submit(spec_toml(run, steps=100000))
        queued = d.submit(spec_toml(run + "2", steps=5))  # waits for the only slot
        d.wait(running.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=2)
        self.assertEqual(d.get(queued.id).state, job_pb2.JOB_STATE_QUEUED)
        pids = d.workers(running.id)
        self.assertEqual(len(pids), 1)
        d.kill9()
        # PR_SET_PDEATHSIG: the workers die with the daemon.
        self.assertTrue(wait_gone(d.real_state_dir, running.id, timeout=5), pids)

        t0 = time.time()
        d2 = Daemon(state, cpu_slots=1)
        print(f"restart → serving in {time.time() - t0:.2f} s")
        job = d2.get(running.id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("daemon restarted", job.reason)
        self.assertEqual(getattr(job.transitions[-1], "from"), job_pb2.JOB_STATE_RUNNING)
        self.assertGreaterEqual(job.last_steps[0].step, 2)  # kept across the restart
        # The queued job was queued again and runs to completion.
        done = d2.wait(queued.id, timeout=60)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        # WatchJob of a job that ended before this daemon started: snapshot + terminal state.
        events = d2.events(running.id, timeout=10)
        self.assertEqual(events[-1].to_state, job_pb2.JOB_STATE_FAILED)
        self.assertTrue(d2.serving())
        d2.stop()
        self.assertEqual(d2.proc.returncode, 0)

    def test_job_that_asks_to_resume_continues_from_its_checkpoint(self):
        state = os.path.join(TMP, "state_resume")
        run = os.path.join(TMP, "run_resume")
        d = Daemon(state, cpu_slots=1)
        job = d.submit(spec_toml(run, steps=80, resume=True, checkpoint_every=5))
        d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=12)
        d.kill9()
        self.assertTrue(wait_gone(d.real_state_dir, job.id, timeout=5))
        d2 = Daemon(state, cpu_slots=1)
        requeue = [t for t in d2.get(job.id).transitions if t.to == job_pb2.JOB_STATE_QUEUED][-1]
        self.assertIn("resuming from", requeue.reason)
        done = d2.wait(job.id, timeout=240)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        states = [t.to for t in done.transitions]
        self.assertIn(job_pb2.JOB_STATE_QUEUED, states[1:])  # queued again after the restart
        log = open(os.path.join(d2.real_state_dir, "jobs", job.id, "rank-0.log")).read()
        self.assertRegex(log, r"resumed from .*step-000000(1[0-9]|[2-9][0-9])")
        d2.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
