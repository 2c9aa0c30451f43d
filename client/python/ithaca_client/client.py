"""Client: ithacad's JobService from Python (what the `ithaca` CLI does, for notebooks, sweep
scripts and pipelines). Calls return the API's protobuf messages (ithaca_client.pb: NodeInfo,
PlanJobResponse, LogLine), and jobs as Job (the message, its `state` a JobState); `watch` yields
typed events and resumes a dropped stream where it stopped."""
import dataclasses
import datetime
import enum
import logging
import os
import stat
import time

import grpc

from . import toml as _toml
from ._generated import health_pb2, health_pb2_grpc
from ._generated import job_pb2 as pb
from ._generated import job_pb2_grpc

DEFAULT_ADDRESS = "127.0.0.1:50051"
# What the daemon calls an override in its errors: this client's `overrides=`, not the CLI's --set.
_OVERRIDES_FLAG = "overrides"
_log = logging.getLogger("ithaca_client")


class JobState(enum.IntEnum):
    """ithaca.v1.JobState; compares equal to the protobuf's numbers (job.state)."""
    UNSPECIFIED = pb.JOB_STATE_UNSPECIFIED
    QUEUED = pb.JOB_STATE_QUEUED
    STARTING = pb.JOB_STATE_STARTING
    RUNNING = pb.JOB_STATE_RUNNING
    SUCCEEDED = pb.JOB_STATE_SUCCEEDED
    FAILED = pb.JOB_STATE_FAILED
    CANCELLING = pb.JOB_STATE_CANCELLING
    CANCELLED = pb.JOB_STATE_CANCELLED

    @property
    def terminal(self):
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @classmethod
    def parse(cls, s):
        """A JobState from itself, its number, or a name ("running", "JOB_STATE_RUNNING")."""
        if isinstance(s, str):
            name = s.upper()
            name = name[len("JOB_STATE_"):] if name.startswith("JOB_STATE_") else name
            try:
                return cls[name]
            except KeyError:
                raise ValueError(f"unknown job state {s!r}; one of "
                                 f"{', '.join(m.name.lower() for m in cls if m)}") from None
        return cls(s)


class Job:
    """A job as ithacad returns it (the API's pb.Job), with `state` a JobState: one type, with
    names, from submit, status, list, cancel, delete, wait and a watch's Snapshot (StateChange
    has JobStates too). A JobState compares equal to the protobuf's numbers. Every other field
    and method is the message's; `.pb` is the message itself (for google.protobuf.json_format)."""
    __slots__ = ("pb",)

    def __init__(self, message):
        object.__setattr__(self, "pb", message)

    def __getattr__(self, name):
        return getattr(self.pb, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"Job is read-only; set fields on its message, job.pb.{name}")

    @property
    def state(self):
        return JobState(self.pb.state)

    def __eq__(self, other):
        return self.pb == (other.pb if isinstance(other, Job) else other)

    def __repr__(self):
        return f"Job(id={self.pb.id!r}, state={self.state.name})"


class IthacaError(grpc.RpcError):
    """An RPC that failed: code() is the grpc.StatusCode, details() the daemon's message
    (which names the spec key or the numbers that are wrong). A grpc.RpcError, so code written
    against grpc's own errors catches it too."""

    def __init__(self, address, code, details):
        self.address = address
        self._code = code
        self._details = details
        hint = " (is ithacad running?)" if code == grpc.StatusCode.UNAVAILABLE else ""
        super().__init__(f"{address}: {code.name}{hint}: {details}")

    def code(self):
        return self._code

    def details(self):
        return self._details


# Events of `Client.watch`, in the order the daemon streams them. `seq` is the daemon's
# sequence number (0 for the snapshot); `time` is UTC.
@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The first event: the job as it is when the watch starts."""
    seq: int
    time: "datetime.datetime | None"
    job: Job


@dataclasses.dataclass(frozen=True)
class StateChange:
    seq: int
    time: "datetime.datetime | None"
    from_state: JobState
    to_state: JobState
    reason: str

    @property
    def terminal(self):
        return self.to_state.terminal


@dataclasses.dataclass(frozen=True)
class Step:
    """One rank's report of one optimizer step (StepReport: loss, tokens_per_second, memory...)."""
    seq: int
    time: "datetime.datetime | None"
    report: pb.StepReport

    rank = property(lambda self: self.report.rank)
    step = property(lambda self: self.report.step)
    total_steps = property(lambda self: self.report.total_steps)
    loss = property(lambda self: self.report.loss)


@dataclasses.dataclass(frozen=True)
class Eval:
    """An evaluation (EvalReport), for the whole job: the held-out loss (tokens 0 without
    eval.path), its loss per eval.position_buckets bucket (PositionLoss: begin, end, loss, tokens)
    and the passkey eval's points ([eval.passkey]; PasskeyResult per length, depth)."""
    seq: int
    time: "datetime.datetime | None"
    report: pb.EvalReport

    step = property(lambda self: self.report.step)
    loss = property(lambda self: self.report.loss)
    tokens = property(lambda self: self.report.tokens)
    passkey = property(lambda self: list(self.report.passkey))
    positions = property(lambda self: list(self.report.positions))


@dataclasses.dataclass(frozen=True)
class Log:
    """A line a worker wrote (only with watch(include_logs=True))."""
    seq: int
    time: "datetime.datetime | None"
    rank: int
    text: str


# A stream that breaks with these is resumed (a port-forward that blinks, a proxy that drops
# idle connections, a daemon restarting); anything else is the daemon's answer.
_RESUMABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
              grpc.StatusCode.CANCELLED)


def ithaca_home():
    return os.environ.get("ITHACA_HOME") or os.path.join(os.path.expanduser("~"), ".ithaca")


def resolve_address(address=None, home=None):
    """Where ithacad is, as the CLI finds it: `address`, else $ITHACA_SERVER, else the grpc=
    line of HOME/ithacad.addr ($ITHACA_HOME, default ~/.ithaca), else 127.0.0.1:50051."""
    if address:
        return address
    if os.environ.get("ITHACA_SERVER") and home is None:
        return os.environ["ITHACA_SERVER"]
    addr_file = os.path.join(home or ithaca_home(), "ithacad.addr")
    try:
        with open(addr_file) as f:
            for line in f:
                if line.startswith("grpc="):
                    return line[len("grpc="):].strip()
    except OSError:
        pass
    return DEFAULT_ADDRESS


def _time(ts):
    return ts.ToDatetime(tzinfo=datetime.timezone.utc) if ts.seconds or ts.nanos else None


def _event(e):
    kind = e.WhichOneof("kind")
    t = _time(e.time)
    if kind == "state":
        return StateChange(e.seq, t, JobState(getattr(e.state, "from")), JobState(e.state.to),
                           e.state.reason)
    if kind == "step":
        return Step(e.seq, t, e.step)
    if kind == "eval":
        return Eval(e.seq, t, e.eval)
    if kind == "log":
        return Log(e.seq, t, e.log.rank, e.log.text)
    return Snapshot(e.seq, t, Job(e.job))


def read_token_file(path):
    """The bearer token in `path`, by ithacad's rule for its own (daemon_link/secret_file.h): a
    regular file that other users cannot read or write (group read only for one of our own
    groups), holding at least 16 printable characters. ValueError names what is wrong."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"token_file {path}: not a regular file")
    group, other = st.st_mode & 0o070, st.st_mode & 0o007
    own_groups = {os.getegid(), os.getgid(), *os.getgroups()}
    if other or group & 0o030 or (group and st.st_gid not in own_groups):
        raise ValueError(f"token_file {path}: readable or writable by other users "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
    with open(path) as f:
        token = f.read().strip()
    if len(token) < 16 or any(c <= " " or c > "~" for c in token):
        raise ValueError(f"token_file {path}: the token must be at least 16 printable ASCII "
                         "characters without spaces")
    return token


class Client:
    """A connection to one ithacad.

        Client()                      # $ITHACA_SERVER, $ITHACA_HOME/ithacad.addr, or the default
        Client("10.0.0.5:50051")      # an address (host:port or unix:/path)
        Client("/var/lib/ithaca")     # a state directory: the address in its ithacad.addr

    `token` / `token_file`: sent as "authorization: Bearer <token>"; `ca_file`: a PEM CA
    bundle, which makes the channel TLS. `timeout`: seconds for each unary call."""

    def __init__(self, address=None, *, home=None, token=None, token_file=None, ca_file=None,
                 timeout=30.0):
        if address and home is None and os.path.isdir(address):
            address, home = None, address
        self.address = resolve_address(address, home)
        self.timeout = timeout
        if token_file:
            token = read_token_file(token_file)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        if ca_file:
            with open(ca_file, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            self._channel = grpc.secure_channel(self.address, creds)
        else:
            self._channel = grpc.insecure_channel(self.address)
        self._jobs = job_pb2_grpc.JobServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    # -- plumbing ---------------------------------------------------------------------------

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise IthacaError(self.address, e.code(), e.details()) from None

    @staticmethod
    def _spec_request(spec, toml, overrides, source, base_dir):
        """(spec TOML text, source name, base directory, overrides) of a dict, a path or TOML
        text. The overrides are sent as they are, "KEY=VALUE" each, and applied by ithacad
        (the CLI's --set; engine/spec/overrides.h): a dict's values are written as TOML."""
        if (spec is None) == (toml is None):
            raise TypeError("give a spec (a dict or a path) or toml= (TOML text), not both")
        if toml is not None:
            text = toml
            source = source or "spec.toml"
        elif isinstance(spec, dict):
            text = _toml.dumps(spec)
            source = source or "spec"
        elif isinstance(spec, (str, os.PathLike)):
            path = os.fspath(spec)
            with open(path) as f:
                text = f.read()
            source = source or path
            # As the CLI: relative paths in a spec file resolve against its directory.
            base_dir = base_dir or os.path.dirname(os.path.abspath(path))
        else:
            raise TypeError(f"spec: a dict or a path, got {type(spec).__name__}")
        if overrides is None:
            sets = []
        elif isinstance(overrides, dict):
            sets = [f"{key}={_toml.value_text(value, key)}" for key, value in overrides.items()]
        elif isinstance(overrides, (list, tuple)) and all(isinstance(o, str) for o in overrides):
            sets = list(overrides)  # "KEY=VALUE" each, as on the CLI's command line
        else:
            raise TypeError('overrides: a dict {"training.steps": 10} or a list of '
                            '"KEY=VALUE" strings')
        return text, source, base_dir or os.getcwd(), sets

    # -- the API ----------------------------------------------------------------------------

    def submit(self, spec=None, *, toml=None, overrides=None, source=None, base_dir=None,
               after=None):
        """Queues a job and returns it (Job: .id, .state a JobState). `spec`: a dict (written as
        TOML) or the path of a TOML file; or `toml`: the spec's TOML text. `overrides`:
        {"training.steps": 10, ...} or ["training.steps=10", ...] (the CLI's --set), applied by
        the daemon; its errors name them "overrides". Relative paths in the spec resolve against
        `base_dir` (default: the file's directory, or the current directory) when the daemon's
        host has it, else against its state directory. `after`: a job id (the CLI's --after):
        the job waits, QUEUED, until that job succeeds, and is cancelled if it fails or is
        cancelled (Job.after names it). Admission's warnings are in the returned job's
        .warnings."""
        text, source, base_dir, sets = self._spec_request(spec, toml, overrides, source, base_dir)
        req = pb.SubmitJobRequest(spec_toml=text, source=source, base_dir=base_dir,
                                  overrides=sets, after=after or "",
                                  overrides_flag=_OVERRIDES_FLAG)
        return Job(self._call(self._jobs.SubmitJob, req).job)

    def plan(self, spec=None, *, toml=None, overrides=None, source=None, base_dir=None,
             hardware=None):
        """The memory plan of a spec against the node (pb.PlanJobResponse: .plan.fits, ...);
        `hardware` plans for another node: "h100x1", "h100x8", "h200x1", "h200x8" or
        "gpus=N,gpu_gib=G,host_gib=H" (as `ithaca plan --hardware`)."""
        text, source, base_dir, sets = self._spec_request(spec, toml, overrides, source, base_dir)
        req = pb.PlanJobRequest(spec_toml=text, source=source, base_dir=base_dir, overrides=sets,
                                hardware=hardware or "", overrides_flag=_OVERRIDES_FLAG)
        return self._call(self._jobs.PlanJob, req)

    def status(self, job_id):
        """The job (Job: pb.Job with `state` a JobState)."""
        return Job(self._call(self._jobs.GetJob, pb.GetJobRequest(id=job_id)))

    def list(self, states=None, limit=0):
        """Jobs, newest first; `states`: JobStates or names ("running") to keep."""
        # The daemon answers a page at a time: follow the pages until `limit` jobs (0: all).
        jobs, token = [], ""
        while True:
            req = pb.ListJobsRequest(states=[JobState.parse(s) for s in states or ()],
                                     limit=limit - len(jobs) if limit > 0 else 0,
                                     page_token=token)
            page = self._call(self._jobs.ListJobs, req)
            jobs.extend(Job(j) for j in page.jobs)
            token = page.next_page_token
            if not token or (limit > 0 and len(jobs) >= limit):
                return jobs

    def cancel(self, job_id, reason=""):
        req = pb.CancelJobRequest(id=job_id, reason=reason)
        return Job(self._call(self._jobs.CancelJob, req))

    def delete(self, job_id):
        """Forgets an ended job (record, history, rank logs; never its checkpoint.dir); returns
        its last record. A job that has not ended is refused (FAILED_PRECONDITION)."""
        return Job(self._call(self._jobs.DeleteJob, pb.DeleteJobRequest(id=job_id)).job)

    def node(self):
        return self._call(self._jobs.GetNode, pb.GetNodeRequest())

    def drain(self, undo=False, timeout_seconds=0):
        """`ithaca drain`: pauses scheduling and drains the running jobs that can resume (they
        checkpoint, stop and are queued again); `undo=True` schedules again. Returns the
        DrainResponse (`drained`, `still_running`, `scheduling_paused`)."""
        return self._call(self._jobs.Drain,
                          pb.DrainRequest(undo=undo, timeout_seconds=timeout_seconds),
                          timeout=(timeout_seconds or 300) + 30)  # the daemon waits that long

    def healthy(self):
        """True when ithacad answers its health check with SERVING."""
        r = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=""))
        return r.status == health_pb2.HealthCheckResponse.SERVING

    def logs(self, job_id, *, rank=None, follow=False, tail=None):
        """The workers' output lines (pb.LogLine: .rank, .text); `follow`: until the job ends;
        `tail`: only the last N lines of each rank written so far (then, with follow, the new
        ones)."""
        def read(follow_now):
            req = pb.ReadLogsRequest(id=job_id, follow=follow_now)
            if rank is not None:
                req.rank = rank
            call = self._jobs.ReadLogs(req, metadata=self._metadata)
            try:
                yield from call
            except grpc.RpcError as e:
                raise IthacaError(self.address, e.code(), e.details()) from None
            finally:
                call.cancel()

        if tail is None:
            yield from read(follow)
            return
        import collections
        last, seen = {}, collections.Counter()
        for line in read(False):
            last.setdefault(line.rank, collections.deque(maxlen=tail)).append(line)
            seen[line.rank] += 1
        for r in sorted(last):
            yield from last[r]
        if follow:
            # The daemon streams each rank's file from its start: skip what was shown.
            for line in read(True):
                if seen[line.rank] > 0:
                    seen[line.rank] -= 1
                else:
                    yield line

    def history(self, job_id):
        """Every recorded Step (rank 0's, others sampled) and Eval of a job, oldest first, from
        the daemon's job store (also after the job ended or the daemon restarted)."""
        call = self._jobs.ReadHistory(pb.ReadHistoryRequest(id=job_id), timeout=self.timeout,
                                      metadata=self._metadata)
        try:
            return [_event(e) for e in call]
        except grpc.RpcError as e:
            raise IthacaError(self.address, e.code(), e.details()) from None

    def watch(self, job_id, *, include_logs=False, after_seq=0, resume_for=60.0, timeout=None):
        """Yields the job's events (Snapshot first, then StateChange, Step, Eval and, with
        include_logs, Log) and returns after the terminal StateChange. A stream that breaks
        (UNAVAILABLE and the like) is opened again with after_seq = the last event seen, so no
        event is lost or repeated, for up to `resume_for` seconds without progress; then, or on
        any other error, IthacaError. `timeout`: seconds for the whole watch (TimeoutError)."""
        last_seq = after_seq
        first = True
        give_up_at = None
        end_at = time.monotonic() + timeout if timeout else None
        backoff = 0.2
        while True:
            remaining = end_at - time.monotonic() if end_at else None
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"watch of {job_id}: no terminal state in {timeout} s")
            req = pb.WatchJobRequest(id=job_id, include_logs=include_logs, after_seq=last_seq)
            call = self._jobs.WatchJob(req, timeout=remaining, metadata=self._metadata)
            snapshot = None
            try:
                for e in call:
                    give_up_at, backoff = None, 0.2
                    ev = _event(e)
                    if isinstance(ev, Snapshot):
                        snapshot = ev.job
                        if first:
                            first = False
                            yield ev
                        continue
                    last_seq = max(last_seq, e.seq)
                    yield ev
                    if isinstance(ev, StateChange) and ev.terminal:
                        return
                why = None  # the daemon ended the stream: what it had, it sent
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and end_at:
                    raise TimeoutError(f"watch of {job_id}: no terminal state in {timeout} s")
                if e.code() not in _RESUMABLE:
                    raise IthacaError(self.address, e.code(), e.details()) from None
                why = f"{e.code().name}: {e.details()}"
            finally:
                call.cancel()
            if why is None and snapshot is not None and JobState(snapshot.state).terminal:
                # The daemon ended a stream that began after the job did, without the end: the
                # job's events are gone (the daemon restarted) and its stored state is the end of
                # the story. A stream that broke instead may have lost events it held for us (a
                # resumed stream replays them at once), so it is opened again below.
                yield StateChange(last_seq, _time(snapshot.updated_at), JobState.UNSPECIFIED,
                                  JobState(snapshot.state), snapshot.reason)
                return
            why = why or "the stream ended before the job did"
            now = time.monotonic()
            if give_up_at is None:
                give_up_at = now + resume_for
                _log.warning("ithaca_client: watch of %s broke (%s); resuming after event %d",
                             job_id, why, last_seq)
            if now >= give_up_at:
                raise IthacaError(self.address, grpc.StatusCode.UNAVAILABLE,
                                  f"watch of {job_id} broke ({why}) and did not resume within "
                                  f"{resume_for} s")
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    def wait(self, job_id, *, timeout=None):
        """Blocks until the job ends; returns it (Job) in its terminal state."""
        for _ in self.watch(job_id, timeout=timeout):
            pass
        return self.status(job_id)
