"""End-to-end harness: a real ithacad (with real ithaca-worker processes) on loopback, driven
through ithaca_client (client/python, built from this tree by run_py.sh) and the ithaca CLI."""
import os
import signal
import socket
import subprocess
import threading
import tempfile
import time
import urllib.request

import ithaca_client
from ithaca_client import JobState
from ithaca_client import pb as job_pb2

TMP = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
TERMINAL = (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED)


def state_name(s):
    return job_pb2.JobState.Name(s)


def make_corpus():
    path = os.path.join(TMP, "corpus.tok")
    if not os.path.exists(path):
        subprocess.run([os.environ["ITHACA_TOKENIZE"], "--input", os.environ["ITHACA_CORPUS"],
                        "--output", path], check=True, capture_output=True)
    return path


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
checkpoint = "full"
tile_tokens = 32
[checkpoint]
dir = "{run_dir}/checkpoints"
every = {checkpoint_every}
resume = {"true" if resume else "false"}
[metrics]
log_every = 5
""" + extra


class Daemon:
    """ithacad on 127.0.0.1 with ports it picks; `state_dir` survives restarts."""

    def __init__(self, state_dir, cpu_slots=4, extra=(), cpus=None):
        """`cpus`: pin the daemon and its workers to these cores (one OpenMP thread each)."""
        self.state_dir = state_dir
        os.makedirs(state_dir, exist_ok=True)
        addr_file = os.path.join(state_dir, "ithacad.addr")
        if os.path.exists(addr_file):
            os.unlink(addr_file)
        self.log = open(os.path.join(state_dir, "ithacad.out"), "a")
        self.proc = subprocess.Popen(
            [os.environ["ITHACAD"], "--state-dir", state_dir, "--listen", "127.0.0.1:0",
             "--metrics-listen", "127.0.0.1:0", "--worker-binary", os.environ["ITHACA_WORKER"],
             "--gpus", "0", "--cpu-slots", str(cpu_slots), "--grace-period-s", "3", "--heartbeat-timeout-s", "5",
             "--heartbeat-interval-ms", "500", *extra],
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
        self.client = ithaca_client.Client(state_dir)
        assert self.client.address == self.address, (self.client.address, self.address)
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
        return subprocess.run([os.environ["ITHACA_CLI"], "--server", self.address, *args],
                              capture_output=True, text=True, timeout=120, check=check)

    def workers(self, job_id):
        return workers_of(self.real_state_dir, job_id)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.client.close()
        self.log.close()

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        self.client.close()
        self.log.close()


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
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
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
