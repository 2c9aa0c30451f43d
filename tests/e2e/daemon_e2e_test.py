"""ithacad end to end (world 1): train with streamed steps, metrics and checkpoints; the CLI;
cancel; a worker killed with SIGKILL; a worker that stops heart-beating; bad specs."""
import json
import os
import signal
import subprocess
import threading
import time
import tomllib
import unittest

import grpc
from prometheus_client.parser import text_string_to_metric_families

import harness
from harness import TMP, BlinkingProxy, Daemon, job_pb2, spec_toml, wait_gone
import ithaca_client
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
        mine = lambda fam: [s for s in (fams[fam].samples if fam in fams else [])
                             if s.labels.get("job_id") == job.id]
        # The job ended: its throughput and memory gauges are gone (a sum over the node counts
        # running jobs only; test_cancel_while_running reads them on a running job), what it did
        # last stays.
        for gone in ("ithaca_gpu_memory_bytes", "ithaca_gpu_memory_peak_bytes",
                     "ithaca_tokens_per_second", "ithaca_host_block_inputs_bytes",
                     "ithaca_model_flops_per_second"):
            self.assertEqual(mine(gone), [], gone)
        info = [s for s in fams["ithaca_job_info"].samples if s.labels["job_id"] == job.id]
        self.assertEqual([(s.labels["name"], s.labels["model"], s.value) for s in info],
                         [("e2e", "tiny", 1)])
        hist = {s.name: s.value for s in mine("ithaca_step_duration_seconds")
                if s.name.endswith("_count")}
        self.assertEqual(hist["ithaca_step_duration_seconds_count"], steps)
        self.assertEqual([s.value for s in mine("ithaca_train_step")], [steps])
        tokens = [s.value for s in mine("ithaca_tokens")]  # counter family drops _total
        self.assertEqual(tokens, [steps * 64])
        # The last step saved a checkpoint: its save time came with the step report.
        ckpt = mine("ithaca_checkpoint_seconds")
        self.assertEqual(len(ckpt), 1)
        self.assertGreater(ckpt[0].value, 0)
        self.assertGreater(mine("ithaca_checkpoint_last_timestamp_seconds")[0].value, 1.7e9)
        self.assertEqual(fams["ithaca_queue_wait_seconds"].type, "histogram")
        self.assertEqual(fams["ithaca_build_info"].samples[0].value, 1)
        self.assertGreater(fams["process_resident_memory_bytes"].samples[0].value, 0)
        jobs = {s.labels["state"]: s.value for s in fams["ithaca_jobs"].samples}
        self.assertGreaterEqual(jobs["succeeded"], 1)
        exits = {s.labels["reason"]: s.value for s in fams["ithaca_worker_exits"].samples}
        self.assertGreaterEqual(exits["ok"], 1)
        self.assertTrue(self.d.serving())

    def test_mix_reports_each_source_and_after_is_no_queue_wait(self):
        """A weighted mix of two sources through ithacad: each source's samples, tokens and loss
        in the step line, `ithaca status` and /metrics (a label per source); the CPU slots are
        no GPUs there; and a job submitted --after it waits in ithaca_queue_wait_seconds only
        from the moment the first job succeeded."""
        def queue_wait():
            fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
            got = {s.name: s.value for s in fams["ithaca_queue_wait_seconds"].samples}
            return got["ithaca_queue_wait_seconds_sum"], got["ithaca_queue_wait_seconds_count"]

        run = self.run_dir("mix")
        corpus = harness.make_corpus()
        a, b = os.path.join(run, "web.tok"), os.path.join(run, "code.tok")
        for link in (a, b):
            if not os.path.exists(link):
                os.symlink(corpus, link)
        steps = 5
        toml = spec_toml(run, steps=steps, checkpoint_every=0).replace(
            f'path = "{corpus}"',
            f'path = "{{{a},{b}}}"\nweights = [3, 1]\nmicro_batch = 2\nshuffle = false')
        toml = toml.replace("log_every = 5", "log_every = 1")
        waited, count = queue_wait()
        first = self.d.submit(toml)
        second = self.d.client.submit(toml=spec_toml(self.run_dir("mix-after"), steps=1,
                                                     checkpoint_every=0), after=first.id)
        done = self.d.wait(first.id, timeout=300)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        after = self.d.wait(second.id, timeout=300)
        self.assertEqual(after.state, job_pb2.JOB_STATE_SUCCEEDED, after.reason)

        # [3, 1] over 2 samples a step: A A | B A | A A | B A | A A.
        samples = {1: 2, 2: 1, 3: 2, 4: 1, 5: 2}
        with open(os.path.join(done.log_dir, "rank-0.log")) as f:
            log = f.read()
        for step, n in samples.items():
            self.assertRegex(log, rf"step {step}/{steps} \| .* \| source 1: {n} samples? loss "
                                  rf"[0-9.]+, source 2: {2 - n} samples?( loss [0-9.]+)? \|")
        rank0 = [r for r in done.last_steps if r.rank == 0][0]
        self.assertEqual([(s.source, s.path, s.samples, s.tokens) for s in rank0.sources],
                         [(1, a, 2, 128), (2, b, 0, 0)])
        status = self.d.cli("status", first.id).stdout
        self.assertIn(f"    source 1 ({a}): 2 samples, 128 tokens (128 trained), loss "
                      f"{rank0.sources[0].loss:.4f}\n", status)
        self.assertIn(f"    source 2 ({b}): 0 samples, 0 tokens (0 trained)\n", status)

        fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
        per_source = lambda fam: {s.labels["source"]: (s.labels["path"], s.value)
                                  for s in fams[fam].samples if s.labels["job_id"] == first.id}
        self.assertEqual(per_source("ithaca_source_samples"), {"1": (a, 8), "2": (b, 2)})
        self.assertEqual(per_source("ithaca_source_tokens"), {"1": (a, 8 * 64), "2": (b, 2 * 64)})
        steps_seen = [e.report for e in self.d.client.history(first.id)
                      if isinstance(e, Step) and e.rank == 0]
        last_b = [r.sources[1].loss for r in steps_seen if r.sources[1].samples > 0][-1]
        self.assertAlmostEqual(per_source("ithaca_source_loss")["2"][1], last_b, places=9)
        # A CPU slot is no GPU: its series are labelled by job and rank alone.
        for s in fams["ithaca_train_loss"].samples:
            if s.labels["job_id"] == first.id:
                self.assertNotIn("gpu", s.labels)
                self.assertNotIn("UUID", s.labels)

        # The queue wait of both jobs: each from when it could start, which for the second is
        # the first's success, as the store's transitions say.
        def at(job, state):
            return [t.time.ToMilliseconds() for t in job.transitions if t.to == state][-1] / 1e3
        expected = (at(done, job_pb2.JOB_STATE_STARTING) - at(done, job_pb2.JOB_STATE_QUEUED)) + (
            at(after, job_pb2.JOB_STATE_STARTING) -
            max(at(after, job_pb2.JOB_STATE_QUEUED), at(done, job_pb2.JOB_STATE_SUCCEEDED)))
        total, n = queue_wait()
        self.assertEqual(n - count, 2)
        self.assertAlmostEqual(total - waited, expected, delta=0.01)
        ran = at(done, job_pb2.JOB_STATE_SUCCEEDED) - at(done, job_pb2.JOB_STATE_STARTING)
        self.assertLess(total - waited, ran, "waiting for --after is not queue wait")

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
        # Not a terminal: at most a line a second; when steps were left out, stderr says so.
        shown = [l for l in r.stdout.splitlines() if l.startswith("step ")]
        if len(shown) < 8:
            self.assertIn("at most one step line a second", r.stderr)
            self.assertIn("--steps` has every step", r.stderr)
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
        self.assertIn("predicted", plan.stdout)
        # The step-time model's figures, by the names scripts read (CPU rates here).
        pj = json.loads(self.d.cli("--json", "plan", spec, check=True).stdout)["plan"]
        self.assertGreater(pj["predicted_step_s"], 0, pj)
        self.assertGreater(pj["predicted_tok_per_s"], 0, pj)
        self.assertEqual(pj["rates"], "cpu")
        self.assertIn(pj["recompute"], ("none", "full", "attention-aware"))
        # A chain of phases (issue 54 F5): each phase's plan, then the whole run's time.
        longer = os.path.join(os.path.dirname(spec), "phase2.toml")
        with open(spec) as f, open(longer, "w") as g:
            g.write(f.read().replace("seq_len = 64", "seq_len = 128"))
        chain = self.d.cli("plan", spec, "--then", longer)
        self.assertEqual(chain.returncode, 0, chain.stdout + chain.stderr)
        self.assertEqual(chain.stdout.count("plan for "), 2, chain.stdout)
        self.assertIn("chain of 2 phases: ", chain.stdout)
        self.assertIn("in all for their training.steps; every phase fits", chain.stdout)
        self.assertIn(f"    phase 2 ({longer}): ", chain.stdout)
        self.assertIn("at data.seq_len 128\n", chain.stdout)
        cj = json.loads(self.d.cli("--json", "plan", spec, "--then", longer, check=True).stdout)
        self.assertEqual(len(cj["phases"]), 2)
        want = sum(p["plan"]["predicted_step_s"] * p["spec"]["steps"] for p in cj["phases"])
        self.assertAlmostEqual(cj["run_seconds"], want, delta=1e-9 * want)
        self.assertEqual(cj["phases"][1]["spec"]["seq_len"], 128)
        bad = self.d.cli("status", "job-999")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("NOT_FOUND", bad.stderr)

        # For scripts: -o name, --set, a header on list, filters, --tail, every field in JSON.
        r = self.d.cli("submit", spec, "-o", "name", "--set", "training.steps=3",
                       "--set", "name=cli-set", check=True)
        set_id = r.stdout.strip()
        self.assertRegex(set_id, r"^job-\d+$")
        self.assertEqual(self.d.cli("watch", set_id).returncode, 0)
        done = self.d.get(set_id)
        self.assertEqual((done.name, done.spec.steps), ("cli-set", 3))
        table = self.d.cli("list", check=True).stdout.splitlines()
        self.assertEqual(table[0].split(), ["ID", "NAME", "STATE", "STEP", "LOSS", "AGE",
                                            "DURATION", "REASON"])
        self.assertEqual(table[1].split()[:4], [set_id, "cli-set", "SUCCEEDED", "3/3"])
        self.assertEqual(self.d.cli("-q", "list", "--state", "succeeded", "--limit", "1",
                                    check=True).stdout, set_id + "\n")
        self.assertEqual(self.d.cli("-o", "name", "list", "--state", "queued,cancelling",
                                    check=True).stdout, "")
        self.assertIn("WORLD", self.d.cli("-o", "wide", "list", check=True).stdout)
        full_log = self.d.cli("logs", job_id, check=True).stdout.splitlines()
        tail = self.d.cli("logs", job_id, "--tail", "3", check=True).stdout.splitlines()
        self.assertEqual(tail, full_log[-3:])
        self.assertGreater(len(full_log), 3)
        full = json.loads(self.d.cli("-o", "json", "status", set_id, check=True).stdout)
        self.assertEqual(full["spec"]["steps"], 3)  # a number, not "3"
        self.assertIsNone(full["failed_rank"])
        self.assertEqual(full["spec"]["checkpoint_dir"], os.path.join(run, "checkpoints"))
        # Flags a command does not take are errors, not ignored.
        for args in (("status", job_id, "-f"), ("cancel", job_id, "--rank", "0"),
                     ("list", "--tail", "3"), ("-o", "name", "node")):
            r = self.d.cli(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn("ithaca --help", r.stderr)
        # A relative path the daemon cannot find says where the daemon looked.
        missing = os.path.join(run, "missing.toml")
        with open(missing, "w") as f:
            f.write(spec_toml(run).replace(harness.make_corpus(), "no-such.tok"))
        r = self.d.cli("submit", missing)
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"{run}/no-such.tok: no such file or directory (looked for on the "
                      "daemon's host", r.stderr)
        self.assertIn(f"relative to the client's directory {run}", r.stderr)

    def test_cli_verbs_as_kubectl_and_ray_have_them(self):
        """-f - (the spec on stdin), wait for several jobs, cancel several, the same JSON
        numbers everywhere, --set errors at the user's line, completion of job ids."""
        run = self.run_dir("cli_verbs")
        spec = spec_toml(run, steps=3, name="stdin")
        r = subprocess.run([os.environ["ITHACA_CLI"], "--server", self.d.address, "submit",
                            "-f", "-", "-o", "name", "--set", "checkpoint.dir=" + run + "/a"],
                           input=spec, capture_output=True, text=True, timeout=60, cwd=run)
        self.assertEqual(r.returncode, 0, r.stderr)
        a = r.stdout.strip()
        b = self.d.cli("submit", "-o", "name", "--set", "checkpoint.dir=" + run + "/b",
                       "--set", "name=second", "-f", self.write(run, "job.toml", spec),
                       check=True).stdout.strip()
        w = self.d.cli("wait", a, b, "--timeout", "120")
        self.assertEqual(w.returncode, 0, w.stdout + w.stderr)
        # "ID: STATE (reason)" as each ends.
        self.assertEqual(sorted(l.split(" (")[0] for l in w.stdout.splitlines()),
                         sorted([f"{a}: SUCCEEDED", f"{b}: SUCCEEDED"]))
        self.assertEqual(self.d.get(a).name, "stdin")
        # int64 as numbers and every field, in `logs --steps` as in `status -o json`.
        steps = [json.loads(l) for l in self.d.cli("logs", a, "--steps", check=True)
                 .stdout.splitlines()]
        self.assertEqual([e["step"]["step"] for e in steps], [1, 2, 3])
        self.assertIsInstance(steps[0]["step"]["tokens"], int)
        self.assertEqual(steps[0]["step"]["rank"], 0)  # a zero field is there, not dropped
        status = json.loads(self.d.cli("-o", "json", "status", a, check=True).stdout)
        self.assertEqual(status["last_steps"][0]["tokens"], steps[-1]["step"]["tokens"])
        # A wait that times out says which jobs are left; cancel takes several ids.
        long = [self.d.cli("submit", "-o", "name", "--set", f"checkpoint.dir={run}/l{i}",
                           "--set", "training.steps=100000", "-f", f"{run}/job.toml",
                           check=True).stdout.strip() for i in range(2)]
        w = self.d.cli("wait", *long, "--timeout", "1")
        self.assertEqual(w.returncode, 1)
        self.assertIn("timed out after 1 s; still running:", w.stderr)
        c = self.d.cli("cancel", *long, "--reason", "done")
        self.assertEqual(c.returncode, 0, c.stderr)
        self.assertEqual(len(c.stdout.splitlines()), 2)
        w = self.d.cli("wait", *long)
        self.assertEqual(w.returncode, 1)  # they did not succeed
        self.assertEqual(sorted(l.split(":")[1].split()[0] for l in w.stdout.splitlines()),
                         ["CANCELLED", "CANCELLED"])
        # A mistyped --set key: named as the --set it came from, not a line past the file's end.
        r = self.d.cli("submit", f"{run}/job.toml", "--set", "training.stepz=3")
        self.assertEqual(r.returncode, 2)
        self.assertIn("training.stepz: unknown key", r.stderr)
        self.assertIn("(from --set training.stepz=3)", r.stderr)
        # plan --max-seq-len: the longest data.seq_len whose plan fits a 64 MiB budget; the
        # next multiple does not (checked with plain `plan`, exit 1 when it does not fit).
        budget = ["--set", "memory.gpu_budget_gib=0.0625"]
        r = self.d.cli("plan", f"{run}/job.toml", "--max-seq-len", "--multiple-of", "64",
                       *budget)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        found = int(r.stdout.split("longest data.seq_len that fits: ")[1].split()[0])
        self.assertEqual(found % 64, 0)
        self.assertIn("head_chunk", r.stdout)
        self.assertEqual(self.d.cli("plan", f"{run}/job.toml", *budget, "--set",
                                    f"data.seq_len={found}").returncode, 0)
        self.assertEqual(self.d.cli("plan", f"{run}/job.toml", *budget, "--set",
                                    f"data.seq_len={found + 64}").returncode, 1)
        # Completion of job ids asks this daemon.
        script = self.d.cli("completion", "bash", check=True).stdout
        words = subprocess.run(
            ["bash", "-c", 'eval "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); '
             '_ithaca; printf "%s\\n" "${COMPREPLY[@]}"', "_", script,
             os.environ["ITHACA_CLI"], "--server", self.d.address, "status", ""],
            capture_output=True, text=True, timeout=60).stdout.split()
        self.assertIn(a, words)
        self.assertIn(long[1], words)

    def test_cli_delete_forgets_ended_jobs_only(self):
        """`ithaca delete`: a running job is refused naming cancel; an ended one is gone from
        status and list, its rank logs too, its checkpoints stay, and its id is not reused."""
        run = self.run_dir("delete")
        spec = self.write(run, "job.toml", spec_toml(run, steps=100000, checkpoint_every=1))
        job_id = self.d.cli("submit", "-o", "name", spec, check=True).stdout.strip()
        self.d.wait(job_id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=2)
        r = self.d.cli("delete", job_id)
        self.assertEqual(r.returncode, 2)
        self.assertIn(f"job {job_id} is RUNNING; only an ended job can be deleted: cancel it "
                      f"first (ithaca cancel {job_id})", r.stderr)
        self.d.cli("cancel", job_id, check=True)
        self.assertEqual(self.d.cli("wait", job_id).returncode, 1)
        job_dir = os.path.join(self.d.real_state_dir, "jobs", job_id)
        self.assertTrue(os.path.exists(os.path.join(job_dir, "rank-0.log")))
        r = self.d.cli("delete", job_id, "no-such-job")
        self.assertEqual(r.returncode, 2)  # one of them could not be deleted
        self.assertEqual(r.stdout, f"{job_id}: deleted (was CANCELLED)\n")
        self.assertIn('job "no-such-job" not found', r.stderr)
        r = self.d.cli("status", job_id)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not found", r.stderr)
        self.assertNotIn(job_id, self.d.cli("-o", "name", "list", check=True).stdout.split())
        self.assertFalse(os.path.exists(job_dir))
        self.assertTrue(os.listdir(os.path.join(run, "checkpoints")), "checkpoints are kept")
        newer = self.d.cli("submit", "-o", "name", "--set", "training.steps=1", "--set",
                           f"checkpoint.dir={run}/other", spec, check=True).stdout.strip()
        self.assertGreater(int(newer.split("-")[1]), int(job_id.split("-")[1]))
        self.d.cli("wait", newer)

    @staticmethod
    def write(directory, name, text):
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_watch_resumes_after_the_connection_drops(self):
        """Python client and CLI watch through a forwarder that drops every connection: each
        sees every step once, in order, and the end."""
        proxy = BlinkingProxy(self.d.address)
        try:
            job = self.d.submit(spec_toml(self.run_dir("blink"), steps=40))
            steps, last = [], None
            with ithaca_client.Client(proxy.address) as c:
                for ev in c.watch(job.id, timeout=120):
                    if isinstance(ev, Step) and ev.rank == 0:
                        steps.append(ev.step)
                        if ev.step in (3, 12):
                            proxy.blink(0.5)
                    last = ev
            # On a mismatch, say how the watch ended and what the daemon says of the job.
            job_now = self.d.client.status(job.id)
            why = (f"the watch ended with {last}; the job is {job_pb2.JobState.Name(job_now.state)}"
                   f" ({job_now.reason})")
            self.assertEqual(steps, list(range(1, 41)), why)
            self.assertEqual(last.to_state, job_pb2.JOB_STATE_SUCCEEDED, why)
            # At least one drop was resumed (how many depends on how fast the steps come).
            self.assertGreaterEqual(proxy.connections, 2)

            job = self.d.submit(spec_toml(self.run_dir("blink-cli"), steps=150))
            cli = subprocess.Popen([os.environ["ITHACA_CLI"], "--server", proxy.address, "watch",
                                    job.id], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
            before = proxy.connections
            while cli.poll() is None:
                time.sleep(0.7)
                proxy.blink(0.3)
            out, err = cli.communicate()
            self.assertEqual(cli.returncode, 0, out + err)
            self.assertIn("step 150/150", out)
            self.assertIn(f"{job.id}: SUCCEEDED", out)
            self.assertIn("resuming after event", err)
            self.assertGreaterEqual(proxy.connections - before, 2)
        finally:
            proxy.close()

    def test_watch_of_an_ended_job_resumes_a_replay_that_drops(self):
        """A watch that begins after the job ended gets the end in its snapshot, then the
        job's events replayed. When the connection drops mid-replay (here: at step 12, the
        replay slowed so that the rest is still on its way) the watch must fetch the rest
        again, not take the snapshot's end for the story's: the Python client and the CLI
        each see every step once, in order, and the end."""
        proxy = BlinkingProxy(self.d.address)
        try:
            job = self.d.submit(spec_toml(self.run_dir("replay"), steps=40))
            self.d.wait(job.id)

            def drop_at_12(step):
                if step == 12:
                    proxy.slow_bytes_per_s = None
                    proxy.blink(0.5)

            proxy.slow_bytes_per_s = 4096
            steps, last = [], None
            with ithaca_client.Client(proxy.address) as c:
                for ev in c.watch(job.id, timeout=120):
                    if isinstance(ev, Step) and ev.rank == 0:
                        steps.append(ev.step)
                        drop_at_12(ev.step)
                    last = ev
            self.assertEqual(steps, list(range(1, 41)), f"the watch ended with {last}")
            self.assertEqual(last.to_state, job_pb2.JOB_STATE_SUCCEEDED)

            # The CLI (-o json prints every event as it comes).
            proxy.slow_bytes_per_s = 4096
            cli = subprocess.Popen([os.environ["ITHACA_CLI"], "--server", proxy.address, "-o",
                                    "json", "watch", job.id], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            steps, events = [], []
            for line in cli.stdout:
                events.append(json.loads(line))
                step = events[-1].get("step")
                if step is not None and step.get("rank", 0) == 0:
                    steps.append(int(step["step"]))
                    drop_at_12(steps[-1])
            err = cli.stderr.read()
            self.assertEqual(cli.wait(timeout=60), 0, err)
            self.assertEqual(steps, list(range(1, 41)), err)
            self.assertEqual(events[-1]["state"]["to"], "JOB_STATE_SUCCEEDED", err)
            self.assertIn("resuming after event", err)
        finally:
            proxy.close()

    def test_weighted_mix_from_the_cli_and_the_python_client(self):
        # data.weights over a brace group whose sources are one relative and one absolute path:
        # each alternative resolves on its own against the spec's directory (it was the whole
        # group, which gave "2 weights for 1 sources" or "BASE//abs/...").
        run = self.run_dir("mix")
        os.symlink(harness.make_corpus(), os.path.join(run, "a.tok"))
        corpus = harness.make_corpus()
        text = spec_toml(run, steps=4).replace(
            f'path = "{corpus}"', f'path = "{{a.tok,{corpus}}}"\nweights = [3.0, 1.0]')
        spec = os.path.join(run, "job.toml")
        with open(spec, "w") as f:
            f.write(text)
        plan = self.d.cli("plan", spec)
        self.assertEqual(plan.returncode, 0, plan.stdout + plan.stderr)
        r = self.d.cli("submit", spec, "--follow", "--set", "checkpoint.dir=" + run + "/ck-cli")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCEEDED", r.stdout)
        job_id = r.stdout.split()[1]
        status = json.loads(self.d.cli("--json", "status", job_id, check=True).stdout)
        self.assertEqual(status["spec"]["data_path"],
                         "{" + os.path.join(run, "a.tok") + "," + corpus + "}")
        c = self.d.client
        d = tomllib.loads(text)
        d["checkpoint"]["dir"] = run + "/ck-py"
        job = c.submit(d, base_dir=run)
        done = c.wait(job.id, timeout=120)
        self.assertEqual(done.state, ithaca_client.JobState.SUCCEEDED, done.reason)
        # Three weights for two sources is still refused, naming both counts.
        d["data"]["weights"] = [1.0, 1.0, 1.0]
        with self.assertRaisesRegex(IthacaError, r"3 weights for 2 sources"):
            c.submit(d, base_dir=run)

    def test_one_version_everywhere(self):
        cli = self.d.cli("--version", check=True).stdout.split()[1]
        daemon = subprocess.run([os.environ["ITHACAD"], "--version"], capture_output=True,
                                text=True, check=True).stdout.split()
        node = json.loads(self.d.cli("-o", "json", "node", check=True).stdout)["version"]
        self.assertRegex(cli, r"^\d+\.\d+\.\d+$")
        self.assertEqual(daemon[:2], ["ithacad", cli])
        self.assertEqual(node, "ithacad " + cli)
        self.assertRegex(self.d.metrics_text(), r'ithaca_build_info\{.*version="' + cli + '"')

    def test_plan_for_hardware_this_daemon_is_not(self):
        # A CPU daemon answers for GPU nodes it is not: Llama-3-8B at 128K over 8 H200s fits,
        # at 2M on one H100 it does not (exit 1, the plan says why; 1M fits there with the
        # optimizer's state and the parameters on the host), and the GPUs must be there.
        run = self.run_dir("hardware")
        spec = os.path.join(run, "job.toml")
        with open(spec, "w") as f:
            f.write(f"""backend = "cuda"
[model]
preset = "llama-3-8b"
[data]
path = "{harness.make_corpus()}"
seq_len = 131072
[parallel]
world = 8
sp = 8
""")
        here = self.d.cli("plan", spec)
        self.assertEqual(here.returncode, 2, here.stdout + here.stderr)
        self.assertIn("needs GPUs", here.stderr)
        r = self.d.cli("-o", "json", "plan", spec, "--hardware", "h200x8")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        plan = json.loads(r.stdout)["plan"]
        self.assertTrue(plan["fits"], plan)
        self.assertEqual(plan["world"], 8)
        # 139.8 GiB less the 2 GiB the CUDA context and libraries keep.
        self.assertAlmostEqual(plan["budget_bytes"] / 2**30, 137.8, delta=0.1)
        one = self.d.cli("plan", spec, "--hardware", "h100x1", "--set", "parallel.world=1",
                         "--set", "parallel.sp=1", "--set", "data.seq_len=2097152")
        self.assertEqual(one.returncode, 1, one.stdout + one.stderr)
        self.assertIn("does NOT fit", one.stdout)
        too_many = self.d.cli("plan", spec, "--hardware", "h200x1")
        self.assertEqual(too_many.returncode, 2)
        self.assertIn("8 ranks", too_many.stderr)
        bad = self.d.cli("plan", spec, "--hardware", "h300x8")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("h300x8", bad.stderr)
        custom = self.d.client.plan(toml=open(spec).read(), source="job.toml",
                                    hardware="gpus=8,gpu_gib=80,host_gib=1024")
        self.assertTrue(custom.plan.fits, custom.plan.summary)
        self.assertAlmostEqual(custom.plan.budget_bytes / 2**30, 78, delta=0.1)
        # Qwen2.5-7B's 28 query heads over 8 ranks: Ulysses 4 x a ring of 2 (issue 51).
        qwen = self.d.cli("plan", spec, "--hardware", "h100x8", "--set", "model.preset=qwen2.5-7b",
                          "--set", "data.seq_len=1048576")
        self.assertEqual(qwen.returncode, 0, qwen.stdout + qwen.stderr)
        self.assertIn("sp 8 = ulysses 4 x ring 2", qwen.stdout)

    def test_python_client_submits_a_dict_and_reads_logs(self):
        run = self.run_dir("dict")
        os.symlink(harness.make_corpus(), os.path.join(run, "data.tok"))
        spec = tomllib.loads(spec_toml(run, steps=6))
        spec["data"]["path"] = "data.tok"  # relative: resolves against base_dir on the daemon
        c = self.d.client
        plan = c.plan(spec, base_dir=run)
        self.assertTrue(plan.plan.fits, plan.plan.summary)
        # Overrides as the CLI's --set strings: the daemon applies them, and names a bad one as
        # this client calls them (overrides=, not --set).
        self.assertEqual(c.plan(spec, base_dir=run, overrides=["data.seq_len=128"]).spec.seq_len,
                         128)
        with self.assertRaisesRegex(ithaca_client.IthacaError,
                                    r"training\.stepz: unknown key.*\(from overrides "
                                    r"training\.stepz=3\)") as bad:
            c.plan(spec, base_dir=run, overrides=["training.stepz=3"])
        self.assertNotIn("--set", bad.exception.details())
        job = c.submit(spec, base_dir=run, overrides={"name": "from-dict", "training.steps": 4})
        # One state type, with names, from every call (watch's were JobStates, submit's ints).
        self.assertIsInstance(job.state, ithaca_client.JobState)
        self.assertIsInstance(c.status(job.id).state, ithaca_client.JobState)
        self.assertIsInstance(c.list(limit=1)[0].state, ithaca_client.JobState)
        events = list(c.watch(job.id, include_logs=True, timeout=120))
        self.assertTrue(any(isinstance(e, ithaca_client.Log) for e in events))
        self.assertIsInstance(events[0].job.state, ithaca_client.JobState)
        done = c.wait(job.id, timeout=60)
        self.assertEqual(done.state, ithaca_client.JobState.SUCCEEDED, done.reason)
        self.assertEqual((done.name, done.spec.steps), ("from-dict", 4))
        self.assertEqual(done.spec.data_path, os.path.join(run, "data.tok"))
        self.assertIn(job.id, [j.id for j in c.list(states=["succeeded"])])
        self.assertEqual(len(c.list(limit=1)), 1)
        history = c.history(job.id)
        self.assertEqual([e.step for e in history if isinstance(e, Step) and e.rank == 0],
                         [1, 2, 3, 4])
        lines = [l.text for l in c.logs(job.id)]
        self.assertIn("step 4/4", "\n".join(lines))
        self.assertEqual([l.text for l in c.logs(job.id, tail=2)], lines[-2:])
        with self.assertRaises(IthacaError) as e:
            c.submit(dict(spec, data={"path": "nowhere.tok", "seq_len": 64}), base_dir=run)
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("daemon's host", e.exception.details())

    def test_cancel_while_running(self):
        run = self.run_dir("cancel")
        job = self.d.submit(spec_toml(run, steps=100000))
        self.d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=2)
        pids = self.d.workers(job.id)
        self.assertEqual(len(pids), 1)
        # A running rank's gauges, through prometheus_client's own parser.
        fams = {f.name: f for f in text_string_to_metric_families(self.d.metrics_text())}
        mine = lambda fam: [s for s in (fams[fam].samples if fam in fams else [])
                             if s.labels.get("job_id") == job.id]
        mem = {s.labels["tier"]: s.value for s in mine("ithaca_gpu_memory_bytes")}
        for tier in ("params", "grads", "optimizer"):  # held between steps
            self.assertGreater(mem[tier], 0, tier)
        peak = {s.labels["tier"]: s.value for s in mine("ithaca_gpu_memory_peak_bytes")}
        for tier in ("params", "grads", "optimizer", "attention", "activations", "block_inputs"):
            self.assertGreater(peak[tier], 0, tier)
            self.assertGreaterEqual(peak[tier], mem[tier], tier)
        self.assertEqual(set(mem), {"params", "grads", "optimizer", "attention", "activations",
                                    "block_inputs", "comm", "workspace"})
        tps = mine("ithaca_tokens_per_second")
        # A CPU slot is no GPU: no gpu or UUID label (issue 54 F9).
        self.assertEqual([s.labels["rank"] for s in tps], ["0"])
        self.assertNotIn("gpu", tps[0].labels)
        self.assertNotIn("UUID", tps[0].labels)
        self.assertGreater(tps[0].value, 0)
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
            (spec_toml(run, extra="[parallel]\nworld = 3\nsp = 3\nring = 1\n"),
             grpc.StatusCode.INVALID_ARGUMENT, "parallel.ring"),
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
