"""ithacad stopped (SIGTERM) or killed (SIGKILL) mid-job, then restarted on the same state
directory: the job's workers never stopped, the new daemon adopts them, the job goes on to the
end and its history has every step, none twice. When the workers are really gone too, the job is
FAILED with its reason (or, when its spec asks to resume and a checkpoint exists, queued again
and resumed from it); queued jobs run, and the daemon is healthy."""
import os
import signal
import time
import unittest

import grpc

from harness import TMP, Daemon, job_pb2, kill_workers, spec_toml, wait_gone
from ithaca_client import IthacaError

STEPS = 60


def rank0_steps(daemon, job_id):
    return [e.report.step for e in daemon.client.history(job_id)
            if type(e).__name__ == "Step" and e.rank == 0]


class RestartE2E(unittest.TestCase):
    def check_adopted(self, name, stop):
        """`stop(daemon)` ends the first daemon mid-job; a second one adopts the job."""
        state = os.path.join(TMP, "state_" + name)
        run = os.path.join(TMP, "run_" + name)
        d = Daemon(state, cpu_slots=2)
        job = d.submit(spec_toml(run, steps=STEPS, extra="[parallel]\nworld = 2\n"))
        queued = d.submit(spec_toml(run + "2", steps=3))  # waits for the job's two slots
        d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=3)
        pids = sorted(d.workers(job.id))
        self.assertEqual(len(pids), 2)
        stop(d)
        # The workers outlive the daemon, and train on meanwhile.
        time.sleep(2)
        self.assertEqual(sorted(d.workers(job.id)), pids)

        d2 = Daemon(state, cpu_slots=2)
        self.assertEqual(d2.get(job.id).state, job_pb2.JOB_STATE_RUNNING)
        self.assertEqual(d2.get(queued.id).state, job_pb2.JOB_STATE_QUEUED)
        # The adopted job still owns its checkpoint.dir: a new job there is refused.
        with self.assertRaises(IthacaError) as refused:
            d2.submit(spec_toml(run, steps=3))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertIn(f"is the checkpoint directory of {job.id}", refused.exception.details())
        done = d2.wait(job.id, timeout=240)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        # One run, never queued again: adopted, not restarted.
        states = [t.to for t in done.transitions]
        self.assertEqual(states.count(job_pb2.JOB_STATE_QUEUED), 1, states)
        self.assertEqual(states.count(job_pb2.JOB_STATE_STARTING), 1, states)
        # Every step reached the store once, the ones taken while no daemon ran included.
        self.assertEqual(rank0_steps(d2, job.id), list(range(1, STEPS + 1)))
        log = open(os.path.join(d2.real_state_dir, "jobs", job.id, "rank-1.log")).read()
        self.assertIn("re-attached to ithacad", log)
        self.assertNotIn("resumed from", log)
        with open(os.path.join(d2.real_state_dir, "ithacad.out")) as f:
            self.assertIn(f"adopting job {job.id} (running): 2 of 2 workers still run", f.read())
        # The slots the adopted job held were its own: the queued job waited for them, then ran.
        after = d2.wait(queued.id, timeout=60)
        self.assertEqual(after.state, job_pb2.JOB_STATE_SUCCEEDED, after.reason)
        self.assertTrue(d2.serving())
        d2.stop()
        self.assertEqual(d2.proc.returncode, 0)

    def test_sigterm_leaves_the_job_running_and_the_next_daemon_adopts_it(self):
        def term(d):
            d.stop(leave_jobs=True)
            self.assertEqual(d.proc.returncode, 0)
        self.check_adopted("term", term)

    def test_sigkill_leaves_the_job_running_and_the_next_daemon_adopts_it(self):
        self.check_adopted("kill", lambda d: d.kill9())

    def test_workers_gone_with_the_daemon_fail_the_job(self):
        state = os.path.join(TMP, "state")
        run = os.path.join(TMP, "run")
        d = Daemon(state, cpu_slots=1)
        running = d.submit(spec_toml(run, steps=100000))
        queued = d.submit(spec_toml(run + "2", steps=5))  # waits for the only slot
        d.wait(running.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=2)
        self.assertEqual(d.get(queued.id).state, job_pb2.JOB_STATE_QUEUED)
        self.assertEqual(len(d.workers(running.id)), 1)
        d.kill9()
        kill_workers(d.real_state_dir, running.id)  # the node rebooted, say
        self.assertTrue(wait_gone(d.real_state_dir, running.id, timeout=5))

        t0 = time.time()
        d2 = Daemon(state, cpu_slots=1)
        print(f"restart → serving in {time.time() - t0:.2f} s")
        job = d2.get(running.id)
        self.assertEqual(job.state, job_pb2.JOB_STATE_FAILED)
        self.assertIn("daemon restarted", job.reason)
        self.assertIn("its workers were gone", job.reason)
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

    def test_adopted_worker_that_dies_fails_the_job_naming_it(self):
        state = os.path.join(TMP, "state_dies")
        d = Daemon(state, cpu_slots=2)
        job = d.submit(spec_toml(os.path.join(TMP, "run_dies"), steps=100000,
                                 extra="[parallel]\nworld = 2\n"))
        d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=2)
        d.kill9()
        d2 = Daemon(state, cpu_slots=2)
        d2.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=2)
        victim = [p for p in d2.workers(job.id)
                  if b"ITHACA_RANK=1" in open(f"/proc/{p}/environ", "rb").read().split(b"\0")]
        os.kill(victim[0], signal.SIGKILL)
        done = d2.wait(job.id, timeout=60)
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        self.assertEqual(done.failed_rank, 1, done.reason)
        self.assertIn("adopted after a daemon restart", done.reason)
        self.assertTrue(wait_gone(d2.real_state_dir, job.id, timeout=10))
        d2.stop()

    def test_drain_checkpoints_stops_and_queues_the_job_for_the_next_daemon(self):
        state = os.path.join(TMP, "state_drain")
        run = os.path.join(TMP, "run_drain")
        d = Daemon(state, cpu_slots=2, extra=["--drain-on-exit"])
        # No checkpoint of its own before step 100000: the drain's is the only one.
        job = d.submit(spec_toml(run, steps=100000, resume=True, checkpoint_every=100000,
                                 extra="[parallel]\nworld = 2\n"))
        d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=5)
        d.stop(leave_jobs=True)
        self.assertEqual(d.proc.returncode, 0)
        self.assertTrue(wait_gone(d.real_state_dir, job.id, timeout=10))
        checkpoints = sorted(c for c in os.listdir(os.path.join(run, "checkpoints"))
                             if c.startswith("step-"))
        self.assertEqual(len(checkpoints), 1, checkpoints)
        drained_at = int(checkpoints[0].split("-")[1])
        self.assertGreaterEqual(drained_at, 5)

        d2 = Daemon(state, cpu_slots=2)
        requeue = [t for t in d2.get(job.id).transitions if t.to == job_pb2.JOB_STATE_QUEUED][-1]
        self.assertEqual(getattr(requeue, "from"), job_pb2.JOB_STATE_RUNNING)
        self.assertIn("drained by ithacad: checkpointed and stopped", requeue.reason)
        d2.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=drained_at + 2)
        log = open(os.path.join(d2.real_state_dir, "jobs", job.id, "rank-0.log")).read()
        self.assertIn(f"resumed from {run}/checkpoints/{checkpoints[0]}", log)
        self.assertIn("rank 0: drained: checkpointed and stopped after step", log)
        d2.client.cancel(job.id)
        self.assertEqual(d2.wait(job.id).state, job_pb2.JOB_STATE_CANCELLED)
        d2.stop()

    def test_job_that_asks_to_resume_continues_from_its_checkpoint(self):
        state = os.path.join(TMP, "state_resume")
        run = os.path.join(TMP, "run_resume")
        d = Daemon(state, cpu_slots=1)
        job = d.submit(spec_toml(run, steps=80, resume=True, checkpoint_every=5))
        d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=12)
        d.kill9()
        kill_workers(d.real_state_dir, job.id)
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
