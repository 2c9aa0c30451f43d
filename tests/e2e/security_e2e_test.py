"""ithacad's security end to end: a bearer token and TLS on every JobService call (a job runs
over them; no token, a wrong token and a plaintext client are refused), the CLI with --ca and
--token-file, the refusal to listen on a reachable address unprotected, --allowed-roots, and
workers dropping root (--worker-user, when the test runs as root)."""
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import unittest

import grpc

import harness
from ithaca_client import Client
from harness import TMP, Daemon, health_pb2, health_pb2_grpc, job_pb2, job_pb2_grpc, spec_toml


def start_daemon_expecting_failure(*args, timeout=30):
    """Runs ithacad with `args` and returns how it exited (it must exit by itself)."""
    state = tempfile.mkdtemp(dir=TMP)
    return subprocess.run([os.environ["ITHACAD"], "--state-dir", state, "--metrics-listen", "",
                           "--worker-binary", os.environ["ITHACA_WORKER"], *args],
                          capture_output=True, text=True, timeout=timeout)


class SecurityE2E(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sec = os.path.join(TMP, "secrets")
        cls.token = harness.make_token(sec)
        cls.wrong_token = harness.make_token(sec, "wrong-token")
        cls.ca, cls.cert, cls.key = harness.make_tls(sec)
        cls.d = Daemon(os.path.join(TMP, "state"),
                       extra=["--auth-token-file", cls.token, "--tls-cert", cls.cert,
                              "--tls-key", cls.key],
                       ca=cls.ca, token_file=cls.token)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        assert cls.d.proc.returncode == 0, cls.d.proc.returncode

    def stub(self, ca=None, token_file=None):
        channel = harness.connect(self.d.address, ca, token_file)
        self.addCleanup(channel.close)
        return job_pb2_grpc.JobServiceStub(channel)

    def assert_unauthenticated(self, stub):
        with open(self.token) as f:
            token = f.read().strip()
        calls = [lambda: stub.GetNode(job_pb2.GetNodeRequest(), timeout=10),
                 lambda: stub.ListJobs(job_pb2.ListJobsRequest(), timeout=10),
                 lambda: stub.SubmitJob(job_pb2.SubmitJobRequest(
                     spec_toml=spec_toml(os.path.join(TMP, "nope"))), timeout=10),
                 lambda: list(stub.WatchJob(job_pb2.WatchJobRequest(id="1"), timeout=10))]
        for call in calls:
            with self.assertRaises(grpc.RpcError) as e:
                call()
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED,
                             e.exception.details())
            self.assertNotIn(token, e.exception.details())

    def test_the_state_is_the_daemons_own(self):
        # N11: others may pass through the state directory (a worker user's workers) but not
        # list or read it; the job store and the lock are the daemon's user's alone.
        state = os.path.join(TMP, "state")
        mode = os.stat(state).st_mode & 0o777
        self.assertEqual(mode & 0o066, 0, oct(mode))
        for name in ("jobs.db", "ithacad.lock", "ithacad.addr"):
            self.assertEqual(os.stat(os.path.join(state, name)).st_mode & 0o777, 0o600, name)
        # Issue 53 N11: nor may they list the job ids or read a job's logs (what the workers
        # write in their rendezvous directory is behind its 0700).
        jobs = os.path.join(state, "jobs")
        paths = [jobs]
        for job in os.listdir(jobs):
            paths.append(os.path.join(jobs, job))
            paths += [os.path.join(jobs, job, n) for n in os.listdir(os.path.join(jobs, job))]
        self.assertTrue(any(p.endswith("rank-0.log") for p in paths), paths)
        for path in paths:
            self.assertEqual(os.stat(path).st_mode & 0o077, 0, path)

    def test_a_job_runs_over_tls_with_the_token(self):
        run = os.path.join(TMP, "tls-run")
        job = self.d.submit(spec_toml(run, steps=6, checkpoint_every=3))
        done = self.d.wait(job.id, timeout=300)
        self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
        events = list(self.d.jobs.WatchJob(job_pb2.WatchJobRequest(id=job.id), timeout=30))
        self.assertEqual(events[-1].job.state, job_pb2.JOB_STATE_SUCCEEDED)

    def test_no_token_is_unauthenticated(self):
        self.assert_unauthenticated(self.stub(ca=self.ca))

    def test_a_wrong_token_is_unauthenticated(self):
        self.assert_unauthenticated(self.stub(ca=self.ca, token_file=self.wrong_token))

    def test_health_needs_no_token(self):
        channel = harness.connect(self.d.address, self.ca)
        self.addCleanup(channel.close)
        r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING)

    def test_a_plaintext_client_gets_nothing_from_the_tls_port(self):
        with self.assertRaises(grpc.RpcError) as e:
            self.stub(token_file=self.token).GetNode(job_pb2.GetNodeRequest(), timeout=5)
        self.assertIn(e.exception.code(),
                      (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))

    def test_a_client_that_does_not_trust_the_ca_is_refused(self):
        other_ca, _, _ = harness.make_tls(os.path.join(TMP, "other-ca"))
        with self.assertRaises(grpc.RpcError) as e:
            self.stub(ca=other_ca, token_file=self.token).GetNode(job_pb2.GetNodeRequest(),
                                                                  timeout=5)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_the_cli_with_ca_and_token_file(self):
        r = self.d.cli("list")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = self.d.cli("node")
        self.assertEqual(r.returncode, 0, r.stderr)
        # The same through the environment.
        env = dict(os.environ, ITHACA_CA=self.ca, ITHACA_TOKEN_FILE=self.token,
                   ITHACA_SERVER=self.d.address)
        r = subprocess.run([os.environ["ITHACA_CLI"], "list"], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        # Without the token: refused, and the CLI says so.
        r = subprocess.run([os.environ["ITHACA_CLI"], "--server", self.d.address, "--ca", self.ca,
                            "list"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("UNAUTHENTICATED", r.stderr)
        r = subprocess.run([os.environ["ITHACA_CLI"], "--server", self.d.address, "--ca", self.ca,
                            "--token-file", self.wrong_token, "list"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("UNAUTHENTICATED", r.stderr)

    def test_a_token_file_others_can_read_is_refused_by_the_clients_too(self):
        # ithacad refuses such a file for itself; the CLI and the Python client refuse to send
        # one, naming the file and the fix, rather than using it silently.
        open_token = harness.make_token(os.path.join(TMP, "client"), "open-token")
        os.chmod(open_token, 0o644)
        r = subprocess.run([os.environ["ITHACA_CLI"], "--server", self.d.address, "--ca", self.ca,
                            "--token-file", open_token, "list"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"--token-file {open_token}: readable or writable by other users", r.stderr)
        self.assertIn("chmod 600", r.stderr)
        with open(open_token) as f:
            self.assertNotIn(f.read().strip(), r.stderr)
        with self.assertRaisesRegex(ValueError, "readable or writable by other users"):
            Client(self.d.address, token_file=open_token, ca_file=self.ca)
        os.chmod(open_token, 0o600)
        r = subprocess.run([os.environ["ITHACA_CLI"], "--server", self.d.address, "--ca", self.ca,
                            "--token-file", open_token, "list"],
                           capture_output=True, text=True, timeout=60)
        self.assertIn("UNAUTHENTICATED", r.stderr)  # a readable-only-by-us file is sent

    def test_paths_outside_the_allowed_roots_are_refused(self):
        # A link inside the allowed root that leads out of it.
        run = os.path.join(TMP, "escape-run")
        os.makedirs(run, exist_ok=True)
        link = os.path.join(run, "etc")
        if not os.path.islink(link):
            os.symlink("/etc", link)
        for toml, key in [
                (spec_toml(run).replace(harness.make_corpus(), f"{link}/hostname"), "data.path"),
                (spec_toml(run).replace('preset = "tiny"',
                                                   f'config = "{link}/passwd"'), "model.config"),
                (spec_toml("/var/tmp/ithaca-escape"), "checkpoint.dir")]:
            with self.assertRaises(grpc.RpcError) as e:
                self.d.submit(toml)
            self.assertEqual(e.exception.code(), grpc.StatusCode.PERMISSION_DENIED,
                             e.exception.details())
            self.assertIn(f"{key}: ", e.exception.details())
            self.assertIn("outside the allowed roots", e.exception.details())
            self.assertNotIn("root:x:0:0", e.exception.details())

    def test_a_weights_index_names_no_shard_outside_the_roots(self):
        # Issue 53 R1: a weight_map could name /etc/shadow (through "..", an absolute path or a
        # link beside the index); ithacad opened it at admission and quoted its size and first 8
        # bytes. Now every shard is refused before it is opened, the same whether it exists.
        w = os.path.join(TMP, "index-escape")
        os.makedirs(w, exist_ok=True)
        for name, target in [("shard-shadow", "/etc/shadow"), ("shard-missing", "/etc/no-such")]:
            if not os.path.islink(os.path.join(w, name)):
                os.symlink(target, os.path.join(w, name))
        run = os.path.join(TMP, "index-escape-run")
        os.makedirs(run, exist_ok=True)
        toml = spec_toml(run).replace('preset = "tiny"', f'preset = "tiny"\nweights = "{w}"')
        details = {}
        for shard, code in [("shard-shadow", grpc.StatusCode.PERMISSION_DENIED),
                            ("shard-missing", grpc.StatusCode.PERMISSION_DENIED),
                            ("../../../../../../../../etc/shadow", grpc.StatusCode.DATA_LOSS),
                            ("/etc/shadow", grpc.StatusCode.DATA_LOSS)]:
            with open(os.path.join(w, "model.safetensors.index.json"), "w") as f:
                f.write('{"weight_map": {"model.norm.weight": "%s"}}' % shard)
            with self.assertRaises(grpc.RpcError) as e:
                self.d.submit(toml)
            self.assertEqual(e.exception.code(), code, e.exception.details())
            self.assertIn("model.weights: ", e.exception.details())
            for leak in ("root:", "header length", "No such file", "bytes"):
                self.assertNotIn(leak, e.exception.details())
            details[shard] = e.exception.details()
        self.assertEqual(details["shard-shadow"].replace("shadow", "X"),
                         details["shard-missing"].replace("missing", "X"))


class StartupRefusals(unittest.TestCase):
    def test_a_reachable_address_needs_a_token_tls_or_insecure(self):
        r = start_daemon_expecting_failure("--listen", "0.0.0.0:0", "--allow-root-workers")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        for flag in ("--auth-token-file", "--tls-cert", "--insecure"):
            self.assertIn(flag, r.stderr)
        r = start_daemon_expecting_failure("--listen", "[::]:0", "--allow-root-workers")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)

    def test_insecure_or_a_token_lets_it_listen_on_every_address(self):
        token = harness.make_token(os.path.join(TMP, "startup"))
        for extra in (["--insecure"], ["--auth-token-file", token]):
            d = Daemon(os.path.join(TMP, "wide-" + extra[0].strip("-")),
                       extra=["--listen", "0.0.0.0:0", *extra],
                       token_file=token if "--auth-token-file" in extra else None)
            try:
                self.assertTrue(d.serving())
                self.assertTrue(d.address.startswith("0.0.0.0:"))
            finally:
                d.stop()
            self.assertEqual(d.proc.returncode, 0)

    def test_the_health_port_chosen_for_zero_is_in_ithacad_addr(self):
        state = os.path.join(TMP, "health-state")
        d = Daemon(state, extra=["--health-listen", "127.0.0.1:0"])
        try:
            with open(os.path.join(state, "ithacad.addr")) as f:
                fields = dict(l.split("=", 1) for l in f.read().split())
            self.assertRegex(fields.get("health", ""), r"^127\.0\.0\.1:[1-9][0-9]*$")
            channel = harness.connect(fields["health"])
            try:
                r = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                            timeout=10)
                self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING)
            finally:
                channel.close()
        finally:
            d.stop()

    def test_a_key_that_is_not_the_certificates_is_named(self):
        # A key of another pair: gRPC only fails to listen; ithacad says which flags disagree.
        _, cert, key = harness.make_tls(os.path.join(TMP, "one-pair"))
        _, _, other_key = harness.make_tls(os.path.join(TMP, "other-pair"))
        r = start_daemon_expecting_failure("--listen", "127.0.0.1:0", "--tls-cert", cert,
                                           "--tls-key", other_key, "--allow-root-workers")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("does the key belong to the certificate?", r.stderr)
        self.assertIn(f"--tls-key {other_key}", r.stderr)
        # An address in use is said to be one, TLS or not.
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            busy = f"127.0.0.1:{s.getsockname()[1]}"
            r = start_daemon_expecting_failure("--listen", busy, "--tls-cert", cert,
                                               "--tls-key", key, "--allow-root-workers")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(f"cannot listen on {busy}: Address already in use", r.stderr)

    def test_a_token_file_others_can_read_is_refused(self):
        token = harness.make_token(os.path.join(TMP, "startup"), "open-token")
        os.chmod(token, 0o644)
        r = start_daemon_expecting_failure("--listen", "127.0.0.1:0", "--auth-token-file", token,
                                           "--allow-root-workers")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("--auth-token-file", r.stderr)
        self.assertIn("chmod 600", r.stderr)
        with open(token) as f:
            self.assertNotIn(f.read().strip(), r.stderr)

    def test_root_needs_a_worker_user(self):
        if os.geteuid() == 0:
            r = start_daemon_expecting_failure("--listen", "127.0.0.1:0")
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("--worker-user", r.stderr)
        else:
            r = start_daemon_expecting_failure("--listen", "127.0.0.1:0", "--worker-user",
                                               "nobody")
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("--worker-user: ithacad is not root", r.stderr)


@unittest.skipUnless(os.geteuid() == 0, "dropping to --worker-user needs root")
class WorkerUser(unittest.TestCase):
    def test_workers_run_as_the_worker_user(self):
        nobody = pwd.getpwnam("nobody")
        # Everything the worker touches must be reachable by nobody: outside Bazel's 0700 trees.
        base = tempfile.mkdtemp(prefix="ithaca-worker-user-")
        self.addCleanup(shutil.rmtree, base, ignore_errors=True)
        os.chmod(base, 0o755)
        worker = os.path.join(base, "ithaca-worker")
        shutil.copy(os.environ["ITHACA_WORKER"], worker)
        os.chmod(worker, 0o755)
        corpus = os.path.join(base, "corpus.tok")
        shutil.copy(harness.make_corpus(), corpus)
        os.chmod(corpus, 0o644)
        state = os.path.join(base, "state")
        d = Daemon(state, extra=["--worker-user", "nobody", "--worker-binary", worker,
                                 "--allowed-roots", base])
        try:
            toml = spec_toml(base, steps=40).replace(harness.make_corpus(), corpus)
            toml = toml[:toml.index("[checkpoint]")] + "[metrics]\nlog_every = 5\n"
            job = d.submit(toml)
            d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), timeout=120)
            pids = d.workers(job.id)
            self.assertTrue(pids)
            for pid in pids:
                with open(f"/proc/{pid}/status") as f:
                    ids = {l.split(":")[0]: l.split()[1:] for l in f if ":" in l}
                self.assertEqual(ids["Uid"], [str(nobody.pw_uid)] * 4)
                self.assertEqual(ids["Gid"], [str(nobody.pw_gid)] * 4)
                self.assertNotIn("0", ids["Groups"])
            done = d.wait(job.id, timeout=300)
            self.assertEqual(done.state, job_pb2.JOB_STATE_SUCCEEDED, done.reason)
            # The workers' socket sits in a directory only the worker user may enter.
            run = os.stat(os.path.join(os.path.realpath(state), "run"))
            self.assertEqual(run.st_mode & 0o777, 0o700)
            self.assertEqual(run.st_uid, nobody.pw_uid)
            # Issue 53 N11: the job's directory lets the worker user through (its group, 0710)
            # and nobody else; the rank log is the daemon's alone, the rendezvous the workers'.
            jobs = os.path.join(os.path.realpath(state), "jobs")
            job_dir = os.path.join(jobs, job.id)
            for path in (jobs, job_dir):
                st = os.stat(path)
                self.assertEqual(st.st_mode & 0o777, 0o710, path)
                self.assertEqual(st.st_gid, nobody.pw_gid, path)
            self.assertEqual(os.stat(os.path.join(job_dir, "rank-0.log")).st_mode & 0o777, 0o600)
            rdv = [n for n in os.listdir(job_dir) if n.startswith("rendezvous-")]
            self.assertTrue(rdv)
            for name in rdv:
                st = os.stat(os.path.join(job_dir, name))
                self.assertEqual((st.st_mode & 0o777, st.st_uid), (0o700, nobody.pw_uid), name)
        finally:
            d.stop()
        self.assertEqual(d.proc.returncode, 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
