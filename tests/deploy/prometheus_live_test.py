"""A real Prometheus (Debian's prometheus package) scraping a real ithacad that trains a tiny
two-rank CPU job, with deploy/prometheus/prometheus.yml's scrape settings and both rule files
at 1 s intervals. Every PromQL expression of the Grafana dashboard, with its variables resolved
through Prometheus the way Grafana resolves them, returns data; so does every recording rule.
Expressions that join DCGM exporter series (absent here: no GPU) must still be accepted by
Prometheus. Killing a worker fires the worker-exit and failed-job alerts."""
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import unittest
import urllib.parse
import urllib.request

import yaml

sys.path.insert(0, os.environ["ITHACA_E2E_DIR"])  # tests/e2e/harness.py (live.sh sets it)
import harness
from harness import TMP, Daemon, job_pb2, make_corpus, spec_toml, wait_gone

DEPLOY = os.path.abspath("deploy")
PROMETHEUS = "/usr/bin/prometheus"
RULE_FILES = [f"{DEPLOY}/prometheus/ithaca-recording.rules.yml",
              f"{DEPLOY}/prometheus/ithaca-alerts.rules.yml"]
# Grafana's interval macros; with a 1 s scrape interval, $__rate_interval is at least 4 s.
MACROS = {"__rate_interval": "15s", "__interval": "5s", "__range": "1m"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rule_docs():
    rules = []
    for path in RULE_FILES:
        with open(path) as f:
            for g in yaml.safe_load(f)["groups"]:
                rules += g["rules"]
    return rules


def dcgm_names():
    """Recorded series that depend, directly or not, on DCGM exporter series."""
    names = set()
    changed = True
    while changed:
        changed = False
        for r in rule_docs():
            if "record" in r and r["record"] not in names and (
                    "DCGM_" in r["expr"] or any(n in r["expr"] for n in names)):
                names.add(r["record"])
                changed = True
    return names


def needs_dcgm(expr):
    return "DCGM_" in expr or any(n in expr for n in dcgm_names())


# Series this CPU job cannot have: MFU is not exported where the device's peak FLOP/s is
# unknown (a CPU), and eval loss only for a job that evaluates. Their queries must still parse
# and run; they are not required to return data.
OPTIONAL = {"ithaca_mfu_ratio",  # no MFU on a CPU (unknown peak)
            "ithaca_passkey_accuracy",  # only with [eval.passkey]
            "ithaca_host_optimizer_bytes", "ithaca_host_params_bytes",  # only under offload
            "ithaca_source_loss", "ithaca_source_samples_total"}  # only for a data.weights mix


def optional(expr):
    """Also true of recorded series derived from them (job_id:ithaca_mfu_ratio:avg)."""
    return any(n in expr for n in OPTIONAL)


class Prometheus:
    """prometheus on a free loopback port with its own data directory under TMP."""

    def __init__(self, config_path):
        for attempt in range(3):  # the free port may be taken between the probe and the bind
            self.port = free_port()
            self.log = open(os.path.join(TMP, f"prometheus-{attempt}.log"), "w")
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config_path}",
                 f"--storage.tsdb.path={TMP}/tsdb-{attempt}",
                 f"--web.listen-address=127.0.0.1:{self.port}"],
                stdout=self.log, stderr=subprocess.STDOUT)
            deadline = time.time() + 30
            while self.proc.poll() is None and time.time() < deadline:
                try:
                    with urllib.request.urlopen(self.url("/-/ready"), timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    time.sleep(0.2)
            self.stop()
        raise RuntimeError("prometheus did not start: see " + self.log.name)

    def url(self, path):
        return f"http://127.0.0.1:{self.port}{path}"

    def api(self, path, **params):
        """GET /api/v1/<path>; returns the JSON body, also for 4xx answers (parse errors)."""
        q = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(self.url(f"/api/v1/{path}?{q}"), timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            return json.load(e)

    def query(self, expr):
        return self.api("query", query=expr)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def finite(result):
    return [s for s in result if not math.isnan(float(s["value"][1]))]


class PrometheusLive(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # As deployed: every job call carries the token over TLS; /metrics stays plain HTTP.
        secrets = os.path.join(TMP, "secrets")
        cls.token = harness.make_token(secrets)
        cls.ca, cls.cert, cls.key = harness.make_tls(secrets)
        cls.d = Daemon(os.path.join(TMP, "state"), cpu_slots=2,
                       extra=["--auth-token-file", cls.token, "--tls-cert", cls.cert,
                              "--tls-key", cls.key], ca=cls.ca, token_file=cls.token)
        cls.prom = None
        try:
            run = os.path.join(TMP, "run")
            os.makedirs(run, exist_ok=True)
            # Runs until cancelled; two ranks so that per-rank and per-job series differ.
            job = cls.d.submit(spec_toml(run, steps=1000000, seq_len=64, name="live",
                                         extra="[parallel]\nworld = 2\nsp = 2\n"
                                         f"[eval]\npath = \"{make_corpus()}\"\n"
                                         "every = 5\nbatches = 1\n"))
            cls.job_id = job.id
            # Past its first checkpoint (every 10 steps), for the checkpoint series.
            cls.d.wait(job.id, states=(job_pb2.JOB_STATE_RUNNING,), min_step=11, timeout=120)
            cls.prom = Prometheus(cls.write_config())
            cls.wait_for_data()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def write_config(cls):
        """deploy/prometheus/prometheus.yml as shipped (no honor_labels), pointed at this
        daemon, at 1 s intervals, without the DCGM target (no GPU here)."""
        with open(f"{DEPLOY}/prometheus/prometheus.yml") as f:
            cfg = yaml.safe_load(f)
        cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
        cfg["rule_files"] = RULE_FILES
        cfg["scrape_configs"] = [j for j in cfg["scrape_configs"] if j["job_name"] == "ithacad"]
        cfg["scrape_configs"][0]["static_configs"] = [{"targets": [cls.d.metrics_address]}]
        path = os.path.join(TMP, "prometheus.yml")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        return path

    @classmethod
    def wait_for_data(cls):
        """Until every recording rule that does not need DCGM has produced a finite value."""
        want = [r["record"] for r in rule_docs()
                if "record" in r and r["record"] not in dcgm_names() and not optional(r["expr"])]
        deadline = time.time() + 60
        while True:
            missing = [n for n in want if not finite(cls.prom.query(n)["data"]["result"])]
            if not missing:
                return
            if time.time() > deadline:
                raise AssertionError(f"recording rules without data after 60 s: {missing}")
            time.sleep(0.5)

    @classmethod
    def tearDownClass(cls):
        if cls.prom:
            cls.prom.stop()
        cls.d.stop()  # cancels the job: its workers stop with the daemon
        assert wait_gone(cls.d.real_state_dir, cls.job_id), "workers outlived the daemon"

    def test_1_job_id_label_is_the_training_job(self):
        # Without honor_labels: job is the scrape job's, job_id the training job's.
        res = self.prom.query("ithaca_train_step")["data"]["result"]
        self.assertEqual(sorted((s["metric"]["job_id"], s["metric"]["rank"]) for s in res),
                         [(self.job_id, "0"), (self.job_id, "1")])
        for s in res:
            self.assertEqual(s["metric"]["job"], "ithacad")
            self.assertNotIn("exported_job", s["metric"])
            self.assertTrue(s["metric"]["Hostname"])
        up = self.prom.query('up{job="ithacad"}')["data"]["result"]
        self.assertEqual([s["value"][1] for s in up], ["1"])
        jobs = self.prom.query('ithaca_jobs{state="running"}')["data"]["result"]
        self.assertEqual([(s["metric"]["job"], s["value"][1]) for s in jobs], [("ithacad", "1")])

    def test_2_every_rule_loads_and_records(self):
        groups = self.prom.api("rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        self.assertEqual(len(rules), len(rule_docs()))
        for r in rules:
            self.assertEqual(r["health"], "ok", (r["name"], r.get("lastError")))
        for r in rule_docs():
            if "record" not in r:
                continue
            got = self.prom.query(r["record"])
            self.assertEqual(got["status"], "success", r["record"])
            if r["record"] in dcgm_names() or optional(r["expr"]):
                continue
            res = finite(got["data"]["result"])
            self.assertTrue(res, r["record"])
            if r["record"].startswith("job"):
                self.assertEqual({s["metric"]["job_id"] for s in res}, {self.job_id}, r["record"])
        tps = self.prom.query("job_id:ithaca_tokens_per_second:sum")["data"]["result"]
        self.assertGreater(float(tps[0]["value"][1]), 0)

    def variable_values(self, name, variables):
        """Values of a dashboard query variable, asked of Prometheus as Grafana asks."""
        (v,) = [v for v in self.dashboard["templating"]["list"] if v["name"] == name]
        m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["definition"])
        series, label = self.substitute(m.group(1), variables), m.group(2)
        got = self.prom.api(f"label/{label}/values", **{"match[]": series})
        self.assertEqual(got["status"], "success", got)
        return got["data"]

    @staticmethod
    def substitute(expr, variables):
        def value(m):
            name = m.group(1) or m.group(2)
            if name in MACROS:
                return MACROS[name]
            vals = variables[name]
            # Grafana's regex formatting of a multi-value variable.
            escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", x) for x in vals]
            return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)

    def test_3_every_dashboard_expression_returns_data(self):
        with open(f"{DEPLOY}/grafana/ithaca.json") as f:
            self.dashboard = json.load(f)
        jobs = self.variable_values("job_id", {})
        self.assertIn(self.job_id, jobs)
        variables = {"job_id": [self.job_id]}
        ranks = self.variable_values("rank", variables)
        self.assertEqual(sorted(ranks), ["0", "1"])
        variables["rank"] = ranks
        checked = dcgm = skipped = 0
        for p in self.dashboard["panels"]:
            for t in p.get("targets", []):
                expr = self.substitute(t["expr"], variables)
                self.assertNotIn("$", expr)
                got = self.prom.query(expr)
                self.assertEqual(got["status"], "success", (p["title"], expr, got))
                if needs_dcgm(t["expr"]):
                    dcgm += 1
                    continue
                if optional(t["expr"]):
                    skipped += 1
                    continue
                res = finite(got["data"]["result"])
                self.assertTrue(res, (p["title"], expr, got["data"]))
                for s in res:  # a job filter keeps to the chosen job
                    if '$job_id' in t["expr"] and "job_id" in s["metric"]:
                        self.assertEqual(s["metric"]["job_id"], self.job_id, (p["title"], expr))
                checked += 1
        print(f"\n  {checked} dashboard expressions returned data; {dcgm} DCGM joins were "
              f"accepted (no DCGM exporter here); {skipped} of series a CPU job without "
              "evaluation does not have", flush=True)
        self.assertGreaterEqual(checked, 20)
        self.assertGreaterEqual(dcgm, 4)
        # A misspelt expression is refused: the status check above can fail.
        self.assertEqual(self.prom.query("sum by (job_id) (ithaca_mfu_ratio")["status"], "error")

    def test_4_every_ithaca_series_named_exists(self):
        exported = set(re.findall(r"^# TYPE (\w+) (\w+)", self.d.metrics_text(), re.M))
        names = {n for n, _ in exported}
        names |= {n + s for n, t in exported if t == "histogram"
                  for s in ("_bucket", "_sum", "_count")}
        names |= OPTIONAL  # families with no series yet are not in the exposition
        with open(f"{DEPLOY}/grafana/ithaca.json") as f:
            text = f.read()
        for path in RULE_FILES:
            with open(path) as f:
                text += f.read()
        used = set(re.findall(r"(?<![:\w])(ithaca_\w+)", text))
        self.assertTrue(used)
        self.assertEqual(used - names, set())

    def test_5_manifest_flags_are_the_daemons(self):
        """ithacad starts with the StatefulSet's arguments (addresses on loopback here, the
        Secrets' files made here) and its health port answers the probes in plaintext."""
        with open(f"{DEPLOY}/kubernetes/statefulset.yaml") as f:
            (c,) = yaml.safe_load(f)["spec"]["template"]["spec"]["containers"]
        state = os.path.join(TMP, "manifest-state")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            health_port = s.getsockname()[1]
        local = {"--listen": "127.0.0.1:0", "--metrics-listen": "127.0.0.1:0",
                 "--state-dir": state, "--gpus": "0", "--auth-token-file": self.token,
                 "--tls-cert": self.cert, "--tls-key": self.key,
                 "--health-listen": f"127.0.0.1:{health_port}", "--allowed-roots": TMP}
        args = [f"{a.split('=')[0]}={local[a.split('=')[0]]}" if a.split("=")[0] in local else a
                for a in c["args"]]
        self.assertEqual(len(args), len(c["args"]))
        d = Daemon(state, cpu_slots=1, extra=args, ca=self.ca, token_file=self.token)
        try:
            self.assertTrue(d.serving())
            self.assertEqual(d.node().state_dir, os.path.realpath(state))
            channel = harness.connect(f"127.0.0.1:{health_port}")
            try:
                r = harness.health_pb2_grpc.HealthStub(channel).Check(
                    harness.health_pb2.HealthCheckRequest(), timeout=10)
                self.assertEqual(r.status, harness.health_pb2.HealthCheckResponse.SERVING)
            finally:
                channel.close()
        finally:
            d.stop()
        self.assertEqual(d.proc.returncode, 0)

    def test_6_a_killed_worker_fires_the_alerts(self):
        pids = self.d.workers(self.job_id)
        self.assertEqual(len(pids), 2)
        os.kill(pids[0], signal.SIGKILL)
        done = self.d.wait(self.job_id, timeout=30)
        self.assertEqual(done.state, job_pb2.JOB_STATE_FAILED)
        want = {("IthacaJobFailed", None), ("IthacaWorkerExited", "signal")}
        deadline = time.time() + 30
        while True:
            alerts = self.prom.api("alerts")["data"]["alerts"]
            firing = {(a["labels"]["alertname"], a["labels"].get("reason")) for a in alerts
                      if a["state"] == "firing"}
            if want <= firing:
                break
            if time.time() > deadline:
                self.fail(f"firing after 30 s: {firing}; want {want}")
            time.sleep(0.5)
        # A cancelled or finished worker ("killed", "ok") is not an alert.
        self.assertFalse({r for a, r in firing if a == "IthacaWorkerExited"} & {"ok", "killed"})
        # The ended job's throughput and memory are gone, so the node's sums count running
        # jobs only (they read 36k tok/s on a node doing 250, from finished jobs' gauges); what
        # it did last (its step) and its name stay.
        deadline = time.time() + 30
        while True:
            left = [self.prom.query(f'{name}{{job_id="{self.job_id}"}}')["data"]["result"]
                    for name in ("ithaca_tokens_per_second", "ithaca_gpu_memory_bytes",
                                 "ithaca_gpu_memory_peak_bytes")]
            node = self.prom.query("sum(ithaca_tokens_per_second)")["data"]["result"]
            if not any(left) and not node:
                break
            if time.time() > deadline:
                self.fail(f"an ended job's gauges after 30 s: {left}; node sum {node}")
            time.sleep(0.5)
        steps = self.prom.query(f'ithaca_train_step{{job_id="{self.job_id}"}}')["data"]["result"]
        self.assertEqual(len(steps), 2)
        info = self.prom.query(f'ithaca_job_info{{job_id="{self.job_id}"}}')["data"]["result"]
        self.assertEqual([(s["metric"]["name"], s["metric"]["model"]) for s in info],
                         [("live", "tiny")])


if __name__ == "__main__":
    unittest.main(verbosity=2)
