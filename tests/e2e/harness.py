"""End-to-end harness: a real ithacad (with real ithaca-worker processes) on loopback, driven
through ithaca_client (client/python, built from this tree by run_py.sh) and the ithaca CLI."""
import collections
import os
import secrets
import signal
import socket
import subprocess
import threading
import tempfile
import time
import urllib.request

import grpc

import ithaca_client
from ithaca_client import JobState
from ithaca_client import pb as job_pb2
from ithaca_client._generated import health_pb2, health_pb2_grpc, job_pb2_grpc

TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


def state_name(s):
    return job_pb2.JobState.Name(s)


def make_corpus():
    """The demo corpus, byte-level tokenized by ithaca-tokenize: its one train shard."""
    out = os.path.join(TMP, "corpus")
    if not os.path.exists(out):
        subprocess.run([os.environ["ITHACA_TOKENIZE"], "--no-progress", "--output", out,
                        os.environ["ITHACA_CORPUS"]], check=True, capture_output=True)
    return os.path.join(out, "train-00000.tok")


def spec_toml(run_dir, steps=20, extra="", seq_len=64, name="e2e", resume=False,
              checkpoint_every=10):
    return f"""name = "{name}"
backend = "cpu"
[model]
preset = "tiny"
[data]
path = "{make_corpus()}"
seq_len = {seq_len}
[training]
steps = {steps}
lr = 3e-3
warmup_steps = 2
[memory]
recompute = "full"
tile_tokens = 32
[checkpoint]
dir = "{run_dir}/checkpoints"
every = {checkpoint_every}
resume = {"true" if resume else "false"}
[metrics]
log_every = 5
""" + extra


def make_token(directory, name="token"):
    """A bearer token file (mode 600, as ithacad --auth-token-file demands); returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(path, 0o600)
    return path


def make_tls(directory, names=("localhost",), ips=("127.0.0.1",)):
    """A throw-away CA and a server certificate it signed (openssl, as docs/security.md shows);
    returns (ca.pem, server.pem, server.key)."""
    os.makedirs(directory, exist_ok=True)
    ca_key, ca = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.pem")
    key, csr = os.path.join(directory, "server.key"), os.path.join(directory, "server.csr")
    cert, ext = os.path.join(directory, "server.pem"), os.path.join(directory, "server.ext")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=ithaca test CA")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
        "-out", csr, "-subj", "/CN=ithacad")
    with open(ext, "w") as f:
        alt = [f"DNS:{n}" for n in names] + [f"IP:{i}" for i in ips]
        f.write("subjectAltName=" + ",".join(alt) + "\n")
    run("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
        "-days", "2", "-extfile", ext)
    os.chmod(key, 0o600)
    return ca, cert, key


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (over TLS or plaintext alike)."""

    def __init__(self, token):
        self.header = ("authorization", "Bearer " + token)

    def _add(self, details):
        metadata = list(details.metadata or []) + [self.header]
        return _Details(details.method, details.timeout, metadata, details.credentials,
                        details.wait_for_ready, getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._add(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._add(details), request)


class _Details(collections.namedtuple(
        "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready",
                     "compression")), grpc.ClientCallDetails):
    pass


def connect(address, ca=None, token_file=None):
    """A channel to ithacad: TLS when `ca` (its PEM) is given, the token of `token_file` on
    every call when given."""
    if ca:
        with open(ca, "rb") as f:
            channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(f.read()))
    else:
        channel = grpc.insecure_channel(address)
    if token_file:
        with open(token_file) as f:
            channel = grpc.intercept_channel(channel, _Metadata(f.read().strip()))
    return channel


class Daemon:
    """ithacad on 127.0.0.1 with ports it picks; `state_dir` survives restarts. Spec paths must
    lie under TMP (--allowed-roots); as root, workers run as root too (--allow-root-workers)."""

    def __init__(self, state_dir, cpu_slots=4, extra=(), cpus=None, ca=None, token_file=None):
        """`cpus`: pin the daemon and its workers to these cores (one OpenMP thread each).
        `ca`, `token_file`: how to reach a daemon started with TLS or a token (in `extra`)."""
        self.state_dir = state_dir
        self.ca, self.token_file = ca, token_file
        flags = {a.split("=")[0] for a in extra}
        defaults = [] if "--allowed-roots" in flags else ["--allowed-roots", TMP]
        if os.geteuid() == 0 and not flags & {"--worker-user", "--allow-root-workers"}:
            defaults.append("--allow-root-workers")
        os.makedirs(state_dir, exist_ok=True)
        addr_file = os.path.join(state_dir, "ithacad.addr")
        if os.path.exists(addr_file):
            os.unlink(addr_file)
        self.log = open(os.path.join(state_dir, "ithacad.out"), "a")
        self.proc = subprocess.Popen(
            [os.environ["ITHACAD"], "--state-dir", state_dir, "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--worker-binary", os.environ["ITHACA_WORKER"],
             "--gpus", "0", "--cpu-slots", str(cpu_slots), "--grace-period-s", "3",
             "--heartbeat-timeout-s", "5", "--heartbeat-interval-ms", "500",
             # Workers outlive the daemon (it adopts them again on restart); here they give up
             # soon after a test's daemon is gone for good.
             "--daemon-lost-timeout-s", "20", *defaults, *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS=str(len(cpus))) if cpus else None,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        deadline = time.time() + 30
        while not os.path.exists(addr_file):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("ithacad did not start: see " + self.log.name)
            time.sleep(0.05)
        with open(addr_file) as f:
            fields = dict(l.split("=", 1) for l in f.read().split())
        self.address, self.metrics_address = fields["grpc"], fields["metrics"]
        self.pid = int(fields["pid"])
        # Found the way a user's script finds it: through the state directory's ithacad.addr.
        self.client = ithaca_client.Client(state_dir, token_file=token_file, ca_file=ca)
        assert self.client.address == self.address, (self.client.address, self.address)
        # Raw stubs beside the client, for tests of what the wire itself accepts.
        self.channel = connect(self.address, ca, token_file)
        self.jobs = job_pb2_grpc.JobServiceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.real_state_dir = self.node().state_dir

    def node(self):
        return self.client.node()

    def serving(self):
        return self.client.healthy()

    def submit(self, toml, source="job.toml"):
        return self.client.submit(toml=toml, source=source)

    def get(self, job_id):
        return self.client.status(job_id)

    def events(self, job_id, timeout=120, **kwargs):
        """Every event of a watch of `job_id`, the Snapshot first and the terminal state last."""
        return list(self.client.watch(job_id, timeout=timeout, **kwargs))

    def wait(self, job_id, states=TERMINAL, timeout=120, min_step=0):
        deadline = time.time() + timeout
        while True:
            job = self.get(job_id)
            step = max([s.step for s in job.last_steps] or [0])
            if job.state in states and step >= min_step:
                return job
            if time.time() > deadline or (job.state in TERMINAL and job.state not in states):
                raise AssertionError(f"{job_id} is {state_name(job.state)} at step {step} "
                                     f"after {timeout}s: {job.reason}")
            time.sleep(0.05)

    def metrics_text(self):
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as r:
            return r.read().decode()

    def cli(self, *args, check=False):
        auth = (["--ca", self.ca] if self.ca else []) + \
            (["--token-file", self.token_file] if self.token_file else [])
        return subprocess.run([os.environ["ITHACA_CLI"], "--server", self.address, *auth, *args],
                              capture_output=True, text=True, timeout=120, check=check)

    def workers(self, job_id):
        return workers_of(self.real_state_dir, job_id)

    def stop(self, leave_jobs=False):
        """SIGTERM: ithacad leaves running jobs running for the next daemon. Unless `leave_jobs`
        (a test that restarts the daemon), their workers are then killed, so that no test leaves
        training processes behind."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        self._close(leave_jobs)

    def kill9(self, leave_jobs=True):
        self.proc.kill()
        self.proc.wait()
        self._close(leave_jobs)

    def _close(self, leave_jobs):
        self.client.close()
        self.channel.close()
        self.log.close()
        if not leave_jobs:
            kill_workers(self.real_state_dir)


def workers_of(state_dir, job_id):
    """Live (not zombie) ithaca-worker pids of job `job_id` of the daemon using `state_dir`."""
    want = f"ITHACA_JOB_ID={job_id}".encode()
    # Each launch of the job has its own rendezvous directory under the job's.
    rendezvous = f"ITHACA_RENDEZVOUS=file:{state_dir}/jobs/{job_id}/rendezvous-".encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if want in env and any(e.startswith(rendezvous) for e in env):
            pids.append(int(d))
    return pids


def kill_workers(state_dir, job_id=""):
    """SIGKILLs the workers of `job_id` (every job when empty) of the daemon using `state_dir`;
    returns their pids."""
    prefix = f"ITHACA_RENDEZVOUS=file:{state_dir}/jobs/{job_id}".encode()
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(prefix) for e in env):
            try:
                os.kill(int(d), signal.SIGKILL)
                pids.append(int(d))
            except OSError:
                pass
    return pids


def wait_gone(state_dir, job_id, timeout=10):
    deadline = time.time() + timeout
    while workers_of(state_dir, job_id):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


class BlinkingProxy:
    """A TCP forwarder in front of ithacad that can drop every connection through it and refuse
    new ones for a while: a `kubectl port-forward` that blinks."""

    def __init__(self, target):
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        self.sockets = []
        self.down_until = 0.0
        self.connections = 0  # accepted and forwarded
        # The daemon's answers on connections opened from now on come at most this fast
        # (None: as fast as they come), so a test can drop one before it has all arrived.
        self.slow_bytes_per_s = None
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if time.time() < self.down_until:
                conn.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [conn, upstream]
                self.connections += 1
            for a, b, rate in ((conn, upstream, None), (upstream, conn, self.slow_bytes_per_s)):
                threading.Thread(target=self._pump, args=(a, b, rate), daemon=True).start()

    @staticmethod
    def _pump(src, dst, bytes_per_s):
        """Forwards src to dst, at most bytes_per_s (None: as fast as it comes)."""
        piece = 64
        try:
            while data := src.recv(piece if bytes_per_s else 65536):
                dst.sendall(data)
                if bytes_per_s:
                    time.sleep(len(data) / bytes_per_s)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def blink(self, seconds):
        """Drops every open connection; refuses new ones for `seconds`."""
        self.down_until = time.time() + seconds
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.listener.close()
        self.blink(0)
