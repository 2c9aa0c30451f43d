"""`ithaca drain` on a daemon that stays up: the running job checkpoints at a step boundary,
stops and is QUEUED again with that checkpoint; scheduling is paused, so neither it nor a job
submitted meanwhile starts; `ithaca drain --undo` starts the queue again, the drained job resumes
from its checkpoint and ends with the final loss of the same job run without the drain, with
every step once in its history and no restart counted."""
import json
import os
import time
import unittest

from harness import TMP, Daemon, job_pb2, spec_toml

STEPS = 40


def job_toml(run):
    # No checkpoint of its own before step 100000: the drain's is the only one.
    return spec_toml(run, steps=STEPS, resume=True, checkpoint_every=100000,
                     extra="[parallel]\nworld = 2\n")


def rank0_steps(daemon, job_id):
    out = daemon.cli("logs", "--steps", job_id, check=True).stdout
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [(int(e["step"]["step"]), e["step"]["loss"]) for e in events
            if "step" in e and e["step"].get("rank", 0) == 0]


class DrainE2E(unittest.TestCase):
    def test_drain_queues_the_job_with_a_checkpoint_and_undo_resumes_it(self):
        d = Daemon(os.path.join(TMP, "state"), cpu_slots=2)
        reference = d.wait(d.submit(job_toml(os.path.join(TMP, "run_reference"))).id,
                           timeout=240)
        self.assertEqual(reference.state, job_pb2.JOB_STATE_SUCCEEDED, reference.reason)

        run = os.path.join(TMP, "run_drained")
        job = d.submit(job_toml(run))
        d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=5)
        drained = d.cli("drain", "--timeout", "120")
        self.assertEqual(drained.returncode, 0, drained.stdout + drained.stderr)
        self.assertIn(f"{job.id} drained: checkpointed, stopped and queued", drained.stdout)
        self.assertIn("scheduling paused", drained.stdout)
        queued = d.get(job.id)
        self.assertEqual(queued.state, job_pb2.JOB_STATE_QUEUED, queued.reason)
        self.assertIn("drained by ithacad: checkpointed and stopped", queued.reason)
        checkpoints = sorted(c for c in os.listdir(os.path.join(run, "checkpoints"))
                             if c.startswith("step-"))
        self.assertEqual(len(checkpoints), 1, checkpoints)
        drained_at = int(checkpoints[0].split("-")[1])
        self.assertGreaterEqual(drained_at, 5)
        self.assertLess(drained_at, STEPS)
        self.assertEqual(max(s for s, _ in rank0_steps(d, job.id)), drained_at)

        # Paused: nothing starts, neither the drained job nor a new one.
        later = d.submit(spec_toml(os.path.join(TMP, "run_later"), steps=4))
        time.sleep(2)
        self.assertEqual(d.get(job.id).state, job_pb2.JOB_STATE_QUEUED)
        self.assertEqual(d.get(later.id).state, job_pb2.JOB_STATE_QUEUED)
        self.assertTrue(d.node().scheduling_paused)
        self.assertIn("scheduling paused", d.cli("node", check=True).stdout)

        undo = d.cli("drain", "--undo")
        self.assertEqual(undo.returncode, 0, undo.stdout + undo.stderr)
        self.assertFalse(d.node().scheduling_paused)
        self.assertFalse(d.client.drain(undo=True).scheduling_paused)  # the Python client's
        done = d.wait(job.id, timeout=240)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        self.assertEqual(d.wait(later.id, timeout=120).state, job_pb2.JOB_STATE_SUCCEEDED)
        self.assertEqual(done.restarts, 0)  # a drain is not a failure
        states = [t.to for t in done.transitions]
        self.assertEqual(states.count(job_pb2.JOB_STATE_STARTING), 2, states)
        log = open(os.path.join(d.real_state_dir, "jobs", job.id, "rank-0.log")).read()
        self.assertIn(f"resumed from {run}/checkpoints/{checkpoints[0]}", log)
        # Every step once, and the losses of the run nothing interrupted.
        steps = rank0_steps(d, job.id)
        self.assertEqual([s for s, _ in steps], list(range(1, STEPS + 1)))
        self.assertEqual(steps, rank0_steps(d, reference.id))
        d.stop()

    def test_a_job_still_starting_is_drained_too(self):
        # Issue 43 N9: a job whose workers were still starting was neither drained nor listed,
        # and ran on while scheduling was paused. Drained right after its submission, it is
        # drained once it runs (or listed when it does not run in time).
        d = Daemon(os.path.join(TMP, "state_starting"), cpu_slots=2)
        job = d.submit(job_toml(os.path.join(TMP, "run_starting")))
        deadline = time.time() + 60
        while d.get(job.id).state == job_pb2.JOB_STATE_QUEUED and time.time() < deadline:
            time.sleep(0.02)
        response = d.client.drain(timeout_seconds=120)
        self.assertIn(job.id, list(response.drained) + list(response.still_running), response)
        if job.id in response.drained:
            self.assertEqual(d.get(job.id).state, job_pb2.JOB_STATE_QUEUED)
        self.assertTrue(d.client.drain(undo=True).scheduling_paused is False)
        done = d.wait(job.id, timeout=240)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        d.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
