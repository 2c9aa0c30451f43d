"""Long-context phases through ithacad (docs/long_context.md): phase 1 trains the tiny model at
seq_len 128 with a checkpoint; phase 2, submitted at once with `after` phase 1 and
`[init] from = "job:<phase 1>"`, waits for it, starts from its weights only (step 1, the LR
warmup from 0) at seq_len 512 with RoPE theta x4 from `[model.rope]`, and exports; its report
shows the chain (phase 1's curve before its own).

The export's config.json must carry the new theta (and a max_position_embeddings of at least the
trained length), and the float64 PyTorch reference (tests/torch_reference) must score the export
as ithaca-model-loss does. Then the refusals, each with its message: a RoPE change on a plain
resume, an init from a missing checkpoint, an init into a checkpoint.dir that holds a run, and
--after an unknown job; and the dependents of a job that is cancelled or fails are cancelled,
saying why, also across a daemon restart."""
import json
import os
import subprocess
import sys
import unittest

import harness
from harness import TMP, Daemon, job_pb2
from ithaca_client import Step

sys.path.insert(0, os.path.join(os.getcwd(), "tests", "torch_reference"))
import torch  # noqa: E402  (Debian's python3-torch, visible in .venv)
from safetensors.torch import load_file  # noqa: E402
import llama_reference  # noqa: E402

TINY_THETA = 10000.0  # the tiny preset's rope_theta (engine/model/presets.cc)
LR, WARMUP = 3e-3, 2


def phase_toml(run_dir, name, seq_len, steps, extra=""):
    return harness.spec_toml(run_dir, steps=steps, seq_len=seq_len, name=name,
                             checkpoint_every=0, extra=extra)


def long_job_toml(run_dir, name):
    """A job that runs until it is stopped."""
    return harness.spec_toml(run_dir, steps=100000, seq_len=64, name=name,
                             checkpoint_every=1000)


class PhasesE2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.state = os.path.join(TMP, "phases-state")
        cls.d = Daemon(cls.state, cpu_slots=2)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def refused(self, toml, code, message, after=None):
        with self.assertRaises(Exception) as cm:
            self.d.client.submit(toml=toml, after=after)
        e = cm.exception
        self.assertEqual(e.code().name, code, e)
        self.assertIn(message, e.details())
        return e.details()

    def test_phase_two_starts_from_phase_one_with_more_theta_and_exports(self):
        run1, run2 = os.path.join(TMP, "phase1"), os.path.join(TMP, "phase2")
        p1 = self.d.submit(phase_toml(run1, "phase1", seq_len=128, steps=4))
        theta = 4 * TINY_THETA
        p2_toml = phase_toml(run2, "phase2", seq_len=512, steps=3, extra=f"""
[model.rope]
theta = {theta}
[init]
from = "job:{p1.id}"
""").replace('[checkpoint]\n', '[checkpoint]\nexport = "f32"\n')
        p2 = self.d.client.submit(toml=p2_toml, after=p1.id)
        self.assertEqual(p2.after, p1.id)
        self.assertEqual(p2.state, job_pb2.JOB_STATE_QUEUED)
        self.assertIn(f"rope_theta {theta:g}", p2.spec.rope)
        self.assertEqual(p2.spec.init_from, os.path.join(run1, "checkpoints"))
        # The dependency is shown by status and list.
        status = self.d.cli("status", p2.id)
        self.assertIn(f"after: {p1.id}", status.stdout)
        self.assertIn("init from: " + os.path.join(run1, "checkpoints"), status.stdout)
        wide = self.d.cli("list", "-o", "wide").stdout
        row = [l for l in wide.splitlines() if l.startswith(p2.id + " ")]
        self.assertEqual(len(row), 1, wide)
        self.assertIn(p1.id, row[0])

        self.d.wait(p1.id, timeout=300)
        self.assertEqual(self.d.get(p1.id).state, job_pb2.JOB_STATE_SUCCEEDED)
        done = self.d.wait(p2.id, timeout=600)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)

        # A fresh run: its first step is step 1, at the warmup's first rate (from 0), not at
        # where phase 1's schedule ended.
        steps = [e.report for e in self.d.client.history(p2.id)
                 if isinstance(e, Step) and e.rank == 0]
        self.assertEqual(steps[0].step, 1)
        self.assertAlmostEqual(steps[0].lr, LR * 1 / WARMUP, places=12)
        self.assertEqual(steps[0].tokens, 512)
        with open(os.path.join(done.log_dir, "rank-0.log")) as f:
            log = f.read()
        self.assertIn("init from " + os.path.join(run1, "checkpoints"), log)
        self.assertNotIn("resumed from", log)

        # Phase 2's report shows its chain (issue 54 F8): phase 1's curve before its own, and a
        # row per phase.
        out = os.path.join(run2, "report.html")
        self.d.cli("report", p2.id, "--out", out, check=True)
        with open(out) as f:
            page = f.read()
        self.assertIn("Loss across the chain", page)
        self.assertIn(f'data-series="phase 1 {p1.id} train loss"', page)
        self.assertIn(f'data-series="phase 2 {p2.id} train loss"', page)
        self.assertIn(f"<tr><td>1</td><td>{p1.id}</td><td>phase1</td><td>128</td><td>4 of 4</td>"
                      "<td>1-4</td>", page)
        self.assertIn(f"<tr><td>2</td><td>{p2.id}</td><td>phase2</td><td>512</td><td>3 of 3</td>"
                      "<td>5-7</td>", page)

        # The export's config.json: the new theta, in the checkpoint's dialect, and the trained
        # length as its context.
        export = os.path.join(run2, "checkpoints", "export")
        with open(os.path.join(export, "config.json")) as f:
            cfg = json.load(f)
        self.assertEqual(cfg["rope_theta"], theta)
        self.assertEqual(cfg["rope_scaling"]["rope_type"], "llama3")  # the model's own scaling
        self.assertGreaterEqual(cfg["max_position_embeddings"], 512)
        # Phase 1's export-free checkpoint still has the old theta.
        ck1 = sorted(d for d in os.listdir(os.path.join(run1, "checkpoints"))
                     if d.startswith("step-"))[-1]
        with open(os.path.join(run1, "checkpoints", ck1, "model", "config.json")) as f:
            self.assertEqual(json.load(f)["rope_theta"], TINY_THETA)

        # The export scored by the independent float64 reference and by ithaca-model-loss.
        with open(os.environ["ITHACA_CORPUS"], "rb") as f:
            ids = list(f.read()[:513])
        ids_json = os.path.join(TMP, "phase2-ids.json")
        with open(ids_json, "w") as f:
            json.dump({"input_ids": ids}, f)
        out = subprocess.run([os.path.join(os.getcwd(), "engine", "checkpoint",
                                           "ithaca-model-loss"), export, ids_json],
                             capture_output=True, text=True, check=True)
        ithaca = json.loads(out.stdout)["loss"]
        weights = {k: v.double() for k, v in
                   load_file(os.path.join(export, "model.safetensors")).items()}
        window = torch.tensor(ids)
        with torch.no_grad():
            ref = llama_reference.forward(cfg, weights, window[:-1], window[1:]).item()
        print(f"phase 2 export: ithaca-model-loss {ithaca:.6f}, torch reference {ref:.6f}")
        self.assertAlmostEqual(ithaca, ref, delta=1e-4 * max(1.0, abs(ref)))

        # A plain resume of phase 1 with another RoPE is refused at submit.
        resume = harness.spec_toml(run1, steps=8, seq_len=128, name="phase1-more", resume=True,
                                   extra=f"[model.rope]\ntheta = {theta}\n")
        msg = self.refused(resume, "FAILED_PRECONDITION", "model.rope: the job's RoPE (rope_theta")
        self.assertIn("a resume keeps the run's RoPE", msg)
        self.assertIn("[init] from", msg)
        # The same resume with phase 1's RoPE is admitted.
        same = self.d.submit(harness.spec_toml(run1, steps=5, seq_len=128, name="phase1-more",
                                               resume=True))
        self.assertEqual(self.d.wait(same.id, timeout=300).state, job_pb2.JOB_STATE_SUCCEEDED)
        # A new phase may not write into a checkpoint.dir that holds a run: it says which.
        into = phase_toml(run1, "into-phase1", seq_len=128, steps=2,
                          extra=f'[init]\nfrom = "job:{p2.id}"\n')
        msg = self.refused(into, "FAILED_PRECONDITION", "init.from: checkpoint.dir")
        self.assertIn(f"already holds the run of job {same.id}", msg)

    def test_refusals(self):
        missing = os.path.join(TMP, "no-such-checkpoint")
        toml = phase_toml(os.path.join(TMP, "refused"), "refused", seq_len=64, steps=2,
                          extra=f'[init]\nfrom = "{missing}"\n')
        self.refused(toml, "INVALID_ARGUMENT",
                     f"spec.toml: init.from: {missing}: no such directory")
        empty = os.path.join(TMP, "empty-checkpoints")
        os.makedirs(empty, exist_ok=True)
        self.refused(toml.replace(missing, empty), "INVALID_ARGUMENT",
                     f"spec.toml: init.from: {empty}: holds no complete checkpoint")
        self.refused(toml.replace(missing, "job:job-999"), "NOT_FOUND",
                     "spec.toml: init.from: job:job-999: no such job")
        # --after a job the daemon does not know, through the CLI.
        spec = os.path.join(TMP, "after-unknown.toml")
        with open(spec, "w") as f:
            f.write(phase_toml(os.path.join(TMP, "after-unknown"), "after", seq_len=64, steps=2))
        r = self.d.cli("submit", spec, "--after", "job-999")
        self.assertEqual(r.returncode, 2, r)
        self.assertIn('after: no job "job-999"', r.stderr)
        # seq_len past the model's context without [model.rope]: admitted, with a warning that
        # names the RoPE keys (tiny: max_position_embeddings 4096).
        plan = self.d.client.plan(toml=phase_toml(os.path.join(TMP, "warn"), "warn",
                                                  seq_len=8192, steps=1))
        self.assertEqual(len(plan.warnings), 1, plan)
        self.assertIn("exceeds the model's max_position_embeddings 4096", plan.warnings[0])
        self.assertIn("[model.rope] theta", plan.warnings[0])

    def test_dependents_are_cancelled_when_the_job_is_cancelled_or_fails(self):
        # Cancelled: its dependent, and that one's, are cancelled saying why.
        parent = self.d.submit(long_job_toml(os.path.join(TMP, "dep-parent"), "parent"))
        child = self.d.client.submit(
            toml=phase_toml(os.path.join(TMP, "dep-child"), "child", seq_len=64, steps=2),
            after=parent.id)
        grandchild = self.d.client.submit(
            toml=phase_toml(os.path.join(TMP, "dep-grandchild"), "grandchild", seq_len=64,
                            steps=2), after=child.id)
        self.d.wait(parent.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=1, timeout=120)
        self.assertEqual(self.d.get(child.id).state, job_pb2.JOB_STATE_QUEUED)
        self.d.client.cancel(parent.id)
        c = self.d.wait(child.id, timeout=60)
        self.assertEqual(c.state, job_pb2.JOB_STATE_CANCELLED)
        self.assertIn(f"job {parent.id} it waited for (--after) ended cancelled: cancelled by the user", c.reason)
        g = self.d.wait(grandchild.id, timeout=60)
        self.assertEqual(g.state, job_pb2.JOB_STATE_CANCELLED)
        self.assertIn(f"job {child.id} it waited for (--after) ended cancelled", g.reason)
        # --after a job that already failed or was cancelled is refused: it would never start.
        self.refused(phase_toml(os.path.join(TMP, "dep-late"), "late", seq_len=64, steps=2),
                     "FAILED_PRECONDITION", f"after: job {parent.id} already ended cancelled",
                     after=parent.id)

        # Failed (its worker killed, no [retry]): the dependent is cancelled.
        parent = self.d.submit(long_job_toml(os.path.join(TMP, "dep-parent2"), "parent2"))
        child = self.d.client.submit(
            toml=phase_toml(os.path.join(TMP, "dep-child2"), "child2", seq_len=64, steps=2),
            after=parent.id)
        self.d.wait(parent.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=1, timeout=120)
        harness.kill_workers(self.d.real_state_dir, parent.id)
        p = self.d.wait(parent.id, timeout=120)
        self.assertEqual(p.state, job_pb2.JOB_STATE_FAILED)
        c = self.d.wait(child.id, timeout=60)
        self.assertEqual(c.state, job_pb2.JOB_STATE_CANCELLED)
        self.assertIn(f"job {parent.id} it waited for (--after) ended failed", c.reason)

    def test_a_dependency_survives_a_daemon_restart(self):
        state = os.path.join(TMP, "restart-state")
        d = Daemon(state, cpu_slots=2)
        try:
            parent = d.submit(long_job_toml(os.path.join(TMP, "rs-parent"), "parent"))
            child = d.client.submit(
                toml=phase_toml(os.path.join(TMP, "rs-child"), "child", seq_len=64, steps=2),
                after=parent.id)
            d.wait(parent.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=1, timeout=120)
            d.stop(leave_jobs=True)
            d = Daemon(state, cpu_slots=2)
            c = d.get(child.id)
            self.assertEqual(c.state, job_pb2.JOB_STATE_QUEUED)
            self.assertEqual(c.after, parent.id)
            d.client.cancel(parent.id)
            c = d.wait(child.id, timeout=60)
            self.assertEqual(c.state, job_pb2.JOB_STATE_CANCELLED)
            self.assertIn(f"job {parent.id} it waited for (--after)", c.reason)
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
