"""Static checks of deploy/: every YAML/JSON file parses; the Kubernetes objects pass the
Kubernetes API schemas (kubernetes-validate, strict) and fit together (GPUs, tolerations,
/dev/shm, volumes, gRPC probes, Services, ServiceMonitor); the Dockerfile builds the targets
that exist with the packages tools/setup.sh installs; the Grafana dashboard is well formed."""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import kubernetes_validate
import yaml

sys.dont_write_bytecode = True  # no __pycache__ left in deploy/
sys.path.insert(0, "deploy/kubernetes")
import prometheusrule  # noqa: E402  (deploy/kubernetes/prometheusrule.py)

K8S = "deploy/kubernetes"
KUBERNETES_VERSION = "1.30.0"  # oldest cluster the manifests target (gRPC probes are GA)


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def k8s_objects():
    objs = {}
    for path in sorted(glob.glob(f"{K8S}/*.yaml")):
        if path.endswith("kustomization.yaml"):
            continue
        for d in load_docs(path):
            objs[(d["kind"], d["metadata"]["name"])] = d
    return objs


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


class EveryFileParses(unittest.TestCase):
    def test_yaml_and_json(self):
        files = [f for f in glob.glob("deploy/**/*", recursive=True) if os.path.isfile(f)]
        yamls = [f for f in files if f.endswith((".yaml", ".yml"))]
        jsons = [f for f in files if f.endswith(".json")]
        self.assertGreaterEqual(len(yamls), 9, yamls)
        self.assertEqual(jsons, ["deploy/grafana/ithaca.json"])
        for f in yamls:
            self.assertTrue(load_docs(f), f)
        for f in jsons:
            with open(f) as fh:
                json.load(fh)


class Kubernetes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.objs = k8s_objects()
        cls.sts = cls.objs[("StatefulSet", "ithacad")]
        cls.pod = cls.sts["spec"]["template"]["spec"]
        (cls.container,) = cls.pod["containers"]
        cls.ports = {p["name"]: p["containerPort"] for p in cls.container["ports"]}

    def test_builtin_kinds_pass_the_api_schema(self):
        checked = []
        for (kind, name), obj in self.objs.items():
            if obj["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # CRDs: no schema bundled; checked field by field below
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            checked.append(kind)
        self.assertEqual(sorted(checked), ["Namespace", "NetworkPolicy", "PodDisruptionBudget",
                                           "Service", "Service", "ServiceAccount", "StatefulSet"])

    def test_a_bad_field_is_caught(self):
        # The schema check above can fail: a misspelt field is rejected.
        bad = json.loads(json.dumps(self.sts))
        bad["spec"]["template"]["spec"]["toleration"] = bad["spec"]["template"]["spec"]["tolerations"]
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(bad, KUBERNETES_VERSION, strict=True)

    def test_eight_gpus_on_gpu_nodes(self):
        res = self.container["resources"]
        self.assertEqual(int(res["limits"]["nvidia.com/gpu"]), 8)
        self.assertEqual(int(res["requests"]["nvidia.com/gpu"]), 8)
        self.assertIn("--gpus=8", self.container["args"])
        self.assertIn({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                      self.pod["tolerations"])
        terms = self.pod["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        keys = {e["key"] for t in terms for e in t["matchExpressions"]}
        self.assertIn("nvidia.com/gpu.present", keys)
        anti = self.pod["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertEqual(anti[0]["topologyKey"], "kubernetes.io/hostname")
        self.assertTrue(matches(anti[0]["labelSelector"]["matchLabels"],
                                self.sts["spec"]["template"]["metadata"]["labels"]))

    def test_dev_shm_is_memory_backed(self):
        mounts = {m["mountPath"]: m["name"] for m in self.container["volumeMounts"]}
        vols = {v["name"]: v for v in self.pod["volumes"]}
        shm = vols[mounts["/dev/shm"]]["emptyDir"]
        self.assertEqual(shm["medium"], "Memory")
        self.assertRegex(shm["sizeLimit"], r"^\d+Gi$")
        self.assertGreaterEqual(int(shm["sizeLimit"][:-2]), 16)

    def test_state_on_a_persistent_volume_claim(self):
        (claim,) = self.sts["spec"]["volumeClaimTemplates"]
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        state_dir = mounts[claim["metadata"]["name"]]
        self.assertIn(f"--state-dir={state_dir}", self.container["args"])
        self.assertIn("storage", claim["spec"]["resources"]["requests"])
        # The claim is mounted, not shadowed by a pod volume of the same name.
        self.assertNotIn(claim["metadata"]["name"], {v["name"] for v in self.pod["volumes"]})

    def test_probes_are_grpc_health_on_the_plaintext_health_port(self):
        # The kubelet's gRPC probe speaks no TLS: ithacad serves health alone on --health-listen.
        self.assertIn(f"--health-listen=0.0.0.0:{self.ports['health']}", self.container["args"])
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            p = self.container[probe]
            self.assertEqual(set(p) & {"grpc", "httpGet", "tcpSocket", "exec"}, {"grpc"}, probe)
            self.assertEqual(p["grpc"]["port"], self.ports["health"], probe)

    def test_token_and_tls_come_from_secrets(self):
        args = dict(a.split("=", 1) for a in self.container["args"] if "=" in a)
        mounts = {m["name"]: m for m in self.container["volumeMounts"]}
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        secrets = set()
        for flag in ("--auth-token-file", "--tls-cert", "--tls-key"):
            path = args[flag]
            directory, name = os.path.split(path)
            (mount,) = [m for m in mounts.values() if m["mountPath"] == directory]
            self.assertTrue(mount.get("readOnly"), flag)
            secret = volumes[mount["name"]]["secret"]
            self.assertIn(name, [i["path"] for i in secret["items"]], flag)
            # ithacad refuses a secret that others can read: no "other" bits, group = fsGroup.
            self.assertEqual(secret["defaultMode"] & 0o007, 0, flag)
            secrets.add(secret["secretName"])
        self.assertEqual(len(secrets), 2, secrets)  # a generic token Secret and a TLS Secret
        self.assertNotIn("--insecure", self.container["args"])
        # No Secret with a token in the repository: they are made with kubectl (docs/service.md).
        self.assertFalse([k for k in self.objs if k[0] == "Secret"])

    def test_runs_as_non_root_and_bounds_job_paths(self):
        ctx = self.pod["securityContext"]
        self.assertIs(ctx["runAsNonRoot"], True)
        self.assertEqual(ctx["runAsUser"], 10001)
        self.assertEqual(ctx["runAsGroup"], 10001)
        self.assertEqual(ctx["fsGroup"], 10001)
        self.assertNotIn("--worker-user", " ".join(self.container["args"]))  # not root: none
        self.assertNotIn("--allow-root-workers", self.container["args"])
        (claim,) = self.sts["spec"]["volumeClaimTemplates"]
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        self.assertIn(f"--allowed-roots={mounts[claim['metadata']['name']]}",
                      self.container["args"])

    def test_daemon_listens_on_every_interface(self):
        args = self.container["args"]
        self.assertIn(f"--listen=0.0.0.0:{self.ports['grpc']}", args)
        self.assertIn(f"--metrics-listen=0.0.0.0:{self.ports['metrics']}", args)

    def test_restricted_pod_security_standard(self):
        """The "restricted" profile's rules, for the pod and every container."""
        pod_sc = self.pod["securityContext"]
        self.assertEqual(pod_sc["seccompProfile"]["type"], "RuntimeDefault")
        self.assertIs(pod_sc["runAsNonRoot"], True)
        self.assertGreater(pod_sc["runAsUser"], 0)
        self.assertNotIn("hostNetwork", self.pod)
        self.assertNotIn("hostPID", self.pod)
        self.assertNotIn("hostIPC", self.pod)
        allowed_volumes = {"emptyDir", "persistentVolumeClaim", "configMap", "secret",
                           "projected", "downwardAPI", "csi", "ephemeral"}
        for v in self.pod["volumes"]:
            self.assertLessEqual(set(v) - {"name"}, allowed_volumes, v["name"])
        for c in self.pod["containers"] + self.pod.get("initContainers", []):
            sc = c["securityContext"]
            self.assertIs(sc["allowPrivilegeEscalation"], False, c["name"])
            self.assertEqual(sc["capabilities"]["drop"], ["ALL"], c["name"])
            self.assertFalse(sc["capabilities"].get("add"), c["name"])
            self.assertIs(sc["readOnlyRootFilesystem"], True, c["name"])
            self.assertNotEqual(sc.get("runAsUser", pod_sc["runAsUser"]), 0, c["name"])
            self.assertIs(sc.get("runAsNonRoot", pod_sc["runAsNonRoot"]), True, c["name"])
            self.assertNotIn(sc.get("privileged"), (True,), c["name"])
            self.assertNotIn("hostPort", str(c.get("ports")), c["name"])
            # A read-only root needs writable scratch space.
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            self.assertIn("/tmp", mounts, c["name"])

    def test_no_service_account_token(self):
        sa = self.objs[("ServiceAccount", self.pod["serviceAccountName"])]
        self.assertIs(sa["automountServiceAccountToken"], False)
        self.assertIs(self.pod["automountServiceAccountToken"], False)

    def test_node_name_from_the_downward_api(self):
        env = {e["name"]: e for e in self.container["env"]}
        self.assertEqual(env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName")

    def test_pod_disruption_budget(self):
        (pdb,) = [o for (k, _), o in self.objs.items() if k == "PodDisruptionBudget"]
        self.assertTrue(matches(pdb["spec"]["selector"]["matchLabels"],
                                self.sts["spec"]["template"]["metadata"]["labels"]))
        self.assertEqual(pdb["spec"]["maxUnavailable"], 0)

    def test_network_policy(self):
        (np,) = [o for (k, _), o in self.objs.items() if k == "NetworkPolicy"]
        pod_labels = self.sts["spec"]["template"]["metadata"]["labels"]
        self.assertTrue(matches(np["spec"]["podSelector"]["matchLabels"], pod_labels))
        self.assertEqual(np["spec"]["policyTypes"], ["Ingress"])
        by_port = {}
        for rule in np["spec"]["ingress"]:
            for port in rule.get("ports", [{"port": "*"}]):
                by_port.setdefault(port["port"], []).extend(rule["from"])
        # gRPC only from namespaces that opted in; metrics only from the monitoring namespace.
        self.assertEqual(by_port["grpc"],
                         [{"namespaceSelector": {"matchLabels": {"ithaca.dev/api-access": "true"}}}])
        self.assertEqual(by_port["metrics"], [{"namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}])
        for name in ("grpc", "metrics"):
            self.assertIn(name, self.ports)
        # Peers (multi-node rendezvous) reach each other on any port; nothing else does.
        self.assertEqual(by_port["*"], [{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "ithacad"}}}])
        self.assertEqual(set(by_port), {"grpc", "metrics", "*"})

    def test_image_is_set_by_kustomize(self):
        (k,) = load_docs(f"{K8S}/kustomization.yaml")
        (image,) = k["images"]
        self.assertEqual(image["name"], self.container["image"])
        self.assertNotIn(":", self.container["image"])  # the tag comes from the kustomization
        self.assertTrue(image["newTag"])

    def test_services(self):
        pod_labels = self.sts["spec"]["template"]["metadata"]["labels"]
        services = {n: o for (k, n), o in self.objs.items() if k == "Service"}
        self.assertEqual(set(services), {"ithacad", "ithacad-peers"})
        for name, svc in services.items():
            self.assertTrue(matches(svc["spec"]["selector"], pod_labels), name)
            for port in svc["spec"]["ports"]:
                self.assertIn(port["targetPort"], self.ports, name)
        self.assertEqual({p["name"] for p in services["ithacad"]["spec"]["ports"]},
                         {"grpc", "metrics"})
        # The StatefulSet's governing Service is the headless one.
        peers = services[self.sts["spec"]["serviceName"]]
        self.assertEqual(peers["spec"]["clusterIP"], "None")
        self.assertTrue(peers["spec"]["publishNotReadyAddresses"])

    def test_service_monitor_selects_the_metrics_service_once(self):
        sm = self.objs[("ServiceMonitor", "ithacad")]
        self.assertEqual(sm["apiVersion"], "monitoring.coreos.com/v1")
        selected = [o for (k, _), o in self.objs.items()
                    if k == "Service" and matches(sm["spec"]["selector"]["matchLabels"],
                                                  o["metadata"]["labels"])]
        # Exactly one Service, or every pod would be scraped twice.
        self.assertEqual([s["metadata"]["name"] for s in selected], ["ithacad"])
        port_names = {p["name"] for p in selected[0]["spec"]["ports"]}
        (endpoint,) = sm["spec"]["endpoints"]
        self.assertIn(endpoint["port"], port_names)
        # The training job's id is job_id: nothing depends on honorLabels.
        self.assertNotIn("honorLabels", endpoint)
        self.assertEqual(endpoint.get("path", "/metrics"), "/metrics")

    def test_prometheus_rule_is_the_rule_files(self):
        with open(f"{K8S}/prometheusrule.yaml") as f:
            text = f.read()
        self.assertEqual(text, prometheusrule.render(),
                         "stale: run python3 deploy/kubernetes/prometheusrule.py")
        pr = self.objs[("PrometheusRule", "ithaca")]
        groups = []
        for name in ("ithaca-recording.rules.yml", "ithaca-alerts.rules.yml"):
            groups += load_docs(f"deploy/prometheus/{name}")[0]["groups"]
        self.assertEqual(pr["spec"]["groups"], groups)

    def test_kustomizations_name_every_manifest(self):
        (k,) = load_docs(f"{K8S}/kustomization.yaml")
        listed = set(k["resources"])
        present = {os.path.basename(p) for p in glob.glob(f"{K8S}/*.yaml")} - {"kustomization.yaml"}
        self.assertEqual(listed, present)
        (top,) = load_docs("deploy/kustomization.yaml")
        self.assertEqual(top["resources"], ["kubernetes"])
        for gen in top["configMapGenerator"]:
            for f in gen["files"]:
                self.assertTrue(os.path.isfile(os.path.join("deploy", f)), f)

    def test_kustomize_renders(self):
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("kubectl (with kustomize) is not installed")
        # kustomize does not follow the runfiles' symlinks: render a copy.
        tree = os.path.join(os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(), "deploy")
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree("deploy", tree)
        out = subprocess.run([kubectl, "kustomize", tree], capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        docs = [d for d in yaml.safe_load_all(out.stdout) if d]
        kinds = sorted(d["kind"] for d in docs)
        self.assertEqual(kinds, ["ConfigMap", "Namespace", "NetworkPolicy", "PodDisruptionBudget",
                                 "PrometheusRule", "Service", "Service", "ServiceAccount",
                                 "ServiceMonitor", "StatefulSet"])
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
        (k,) = load_docs(f"{K8S}/kustomization.yaml")
        (image,) = k["images"]
        self.assertEqual(sts["spec"]["template"]["spec"]["containers"][0]["image"],
                         f"{image['newName']}:{image['newTag']}")
        for d in docs:
            if d["kind"] != "Namespace":
                self.assertEqual(d["metadata"]["namespace"], "ithaca", d["kind"])
        (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
        self.assertEqual(cm["metadata"]["labels"]["grafana_dashboard"], "1")
        with open("deploy/grafana/ithaca.json") as f:
            self.assertEqual(json.loads(cm["data"]["ithaca.json"]), json.load(f))


class MultiNodeJob(unittest.TestCase):
    """deploy/kubernetes/multinode: one training job over several nodes as an Indexed Job, one
    pod per node, meeting at node 0's rendezvous through a headless Service."""

    DIR = f"{K8S}/multinode"

    @classmethod
    def setUpClass(cls):
        cls.objs = {}
        for path in sorted(glob.glob(f"{cls.DIR}/*.yaml")):
            if not path.endswith("kustomization.yaml"):
                for d in load_docs(path):
                    cls.objs[(d["kind"], d["metadata"]["name"])] = d
        cls.job = cls.objs[("Job", "ithaca-train")]
        cls.svc = cls.objs[("Service", "ithaca-train")]
        cls.pod = cls.job["spec"]["template"]["spec"]
        (cls.container,) = cls.pod["containers"]
        args = cls.container["args"]
        cls.flags = {args[i]: args[i + 1] for i in range(0, len(args) - 1, 2)}

    def test_objects_pass_the_api_schema(self):
        for obj in self.objs.values():
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        self.assertEqual(sorted(k for k, _ in self.objs),
                         ["Job", "PersistentVolumeClaim", "Service"])

    def test_one_pod_per_node_all_at_once(self):
        spec = self.job["spec"]
        self.assertEqual(spec["completionMode"], "Indexed")
        self.assertEqual(spec["completions"], spec["parallelism"])
        self.assertEqual(spec["backoffLimit"], 0)  # a job across nodes fails as a whole
        self.assertEqual(self.pod["restartPolicy"], "Never")
        labels = self.job["spec"]["template"]["metadata"]["labels"]
        (anti,) = self.pod["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        self.assertEqual(anti["topologyKey"], "kubernetes.io/hostname")
        self.assertTrue(matches(anti["labelSelector"]["matchLabels"], labels))
        res = self.container["resources"]
        self.assertEqual(res["limits"]["nvidia.com/gpu"], 8)
        self.assertEqual(res["requests"]["nvidia.com/gpu"], 8)

    def test_launcher_flags_match_the_job(self):
        self.assertEqual(self.container["command"], ["/usr/local/bin/ithaca-worker"])
        self.assertEqual(self.flags["--standalone"], "/etc/ithaca/job.toml")
        self.assertEqual(self.flags["--nproc"], "8")
        self.assertEqual(int(self.flags["--nnodes"]), self.job["spec"]["completions"])
        # The node rank is the pod's completion index.
        self.assertEqual(self.flags["--node-rank"], "$(NODE_RANK)")
        env = {e["name"]: e for e in self.container["env"]}
        self.assertEqual(env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.annotations['batch.kubernetes.io/job-completion-index']")
        # The job's world is every node's GPUs.
        import tomllib
        with open(f"{self.DIR}/job.toml", "rb") as f:
            job = tomllib.load(f)
        self.assertEqual(job["parallel"]["world"],
                         int(self.flags["--nnodes"]) * int(self.flags["--nproc"]))
        self.assertTrue(job["checkpoint"]["dir"].startswith("/shared/"))

    def test_rendezvous_is_node_0_through_the_headless_service(self):
        m = re.fullmatch(r"tcp:([a-z0-9-]+)-0\.([a-z0-9-]+):(\d+)", self.flags["--rendezvous"])
        self.assertIsNotNone(m, self.flags["--rendezvous"])
        job_name, service, port = m.group(1), m.group(2), int(m.group(3))
        # Indexed Job pods are named <job>-<index>; subdomain makes that a DNS name.
        self.assertEqual(job_name, self.job["metadata"]["name"])
        self.assertEqual(self.pod["subdomain"], service)
        self.assertEqual(self.svc["metadata"]["name"], service)
        self.assertEqual(self.svc["spec"]["clusterIP"], "None")
        self.assertTrue(self.svc["spec"]["publishNotReadyAddresses"])
        self.assertTrue(matches(self.svc["spec"]["selector"],
                                self.job["spec"]["template"]["metadata"]["labels"]))
        self.assertIn(port, [p["port"] for p in self.svc["spec"]["ports"]])
        self.assertIn(port, [p["containerPort"] for p in self.container["ports"]])

    def test_restricted_security_context(self):
        pod_sc, sc = self.pod["securityContext"], self.container["securityContext"]
        self.assertTrue(pod_sc["runAsNonRoot"])
        self.assertEqual(pod_sc["runAsUser"], 10001)
        self.assertEqual(pod_sc["seccompProfile"]["type"], "RuntimeDefault")
        self.assertFalse(sc["allowPrivilegeEscalation"])
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])

    def test_volumes(self):
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        vols = {v["name"]: v for v in self.pod["volumes"]}
        self.assertEqual(set(mounts), set(vols))
        self.assertEqual(vols["dshm"]["emptyDir"]["medium"], "Memory")
        self.assertEqual(mounts["dshm"], "/dev/shm")
        claim = vols["shared"]["persistentVolumeClaim"]["claimName"]
        pvc = self.objs[("PersistentVolumeClaim", claim)]
        self.assertEqual(pvc["spec"]["accessModes"], ["ReadWriteMany"])  # every node writes
        (k,) = load_docs(f"{self.DIR}/kustomization.yaml")
        (gen,) = k["configMapGenerator"]
        self.assertEqual(vols["job"]["configMap"]["name"], gen["name"])
        self.assertEqual(gen["files"], ["job.toml"])
        present = {os.path.basename(p) for p in glob.glob(f"{self.DIR}/*.yaml")}
        self.assertEqual(set(k["resources"]), present - {"kustomization.yaml"})


def setup_sh_lists():
    """tools/setup.sh's apt packages and tools/requirements.txt's pins (name==version)."""
    with open("tools/setup.sh") as f:
        text = f.read()
    apt = re.search(r"APT_PACKAGES=\((.*?)\)", text, re.S).group(1).split()
    with open("tools/requirements.txt") as f:
        pip = [l.split("#")[0].strip() for l in f if l.split("#")[0].strip()]
    return apt, pip


class Dockerfile(unittest.TestCase):
    # Packages only the tests need (oracles, a real Prometheus, the fuzzers' clang, openssl for
    # the end-to-end tests' certificates, the Slurm of tests/slurm): not in the image.
    TEST_ONLY = {"python3-numpy", "python3-torch", "prometheus", "python3-yaml", "clang",
                 "libclang-rt-14-dev", "clang-format", "chromium", "openssl", "slurm-wlm", "munge"}

    @classmethod
    def setUpClass(cls):
        with open("deploy/docker/Dockerfile") as f:
            cls.text = f.read()
        # Join continued lines; drop comments.
        lines = [l for l in cls.text.splitlines() if not l.lstrip().startswith("#")]
        cls.instructions = re.sub(r"\\\n", " ", "\n".join(lines)).splitlines()
        cls.args = dict(re.findall(r"^ARG (\w+)=(\S+)", cls.text, re.M))

    def expand(self, s):
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args[m.group(1)], s)

    def test_cuda13_build_and_runtime_stages(self):
        froms = [self.expand(l.split()[1]) for l in self.instructions if l.startswith("FROM ")]
        self.assertEqual(len(froms), 2, froms)
        self.assertRegex(froms[0], r"^nvidia/cuda:13\.\d+\.\d+-cudnn-devel-ubuntu24\.04$")
        self.assertRegex(froms[1], r"^nvidia/cuda:13\.\d+\.\d+-cudnn-runtime-ubuntu24\.04$")
        self.assertEqual(froms[0].split(":")[1].split("-")[0], froms[1].split(":")[1].split("-")[0])
        self.assertIn("FROM nvidia/cuda:${CUDA_VERSION}-cudnn-devel-${UBUNTU} AS build",
                      self.instructions)
        self.assertTrue(any(l.startswith("COPY --from=build /out/bin/ /usr/local/bin/")
                            for l in self.instructions))

    def test_builds_targets_that_exist_and_ships_them(self):
        (build,) = [l for l in self.instructions if "bazel build" in l]
        targets = re.findall(r"//([\w/]+):([\w-]+)", build)
        self.assertEqual({t[1] for t in targets}, {"ithacad", "ithaca-worker", "ithaca"})
        # ithaca-tokenize is the Python tool, copied with its interpreter finder and linked.
        (tok,) = [l for l in self.instructions if "tools/tokenize/ithaca_tokenize.py" in l]
        for f in ("ithaca-tokenize", "ithaca_tokenize.py", "python.sh"):
            self.assertIn(f"tools/tokenize/{f}", tok)
            self.assertTrue(os.path.exists(f"tools/tokenize/{f}"), f)
        self.assertTrue(any("/usr/local/bin/ithaca-tokenize" in l for l in self.instructions))
        for pkg, name in targets:
            with open(f"{pkg}/BUILD") as f:
                self.assertRegex(f.read(), rf'cc_binary\(\s*name = "{re.escape(name)}"',
                                 f"//{pkg}:{name}")
            self.assertIn(f"bazel-bin/{pkg}/{name}", build)

    def test_installs_what_setup_sh_builds_with(self):
        apt, pip = setup_sh_lists()
        (install,) = [l for l in self.instructions if "apt-get install" in l and "bazel" in l]
        for p in set(apt) - self.TEST_ONLY:
            self.assertRegex(install, rf"(^|\s){re.escape(p)}(\s|$)", p)
        frontend = [p for p in pip if p.startswith("nvidia-cudnn-frontend==")]
        self.assertEqual(len(frontend), 1)
        # The pin is read from the same file, not repeated in the Dockerfile.
        self.assertNotIn("nvidia-cudnn-frontend", self.text)
        self.assertIn("COPY tools/requirements.txt tools/", self.instructions)
        (venv,) = [l for l in self.instructions if "python3 -m venv .venv" in l]
        self.assertIn("tools/requirements.txt", venv)

    def test_runs_ithacad_as_the_manifest_expects(self):
        objs = k8s_objects()
        pod = objs[("StatefulSet", "ithacad")]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        self.assertNotIn("command", c)  # the image's ENTRYPOINT runs, with the manifest's args
        self.assertIn('ENTRYPOINT ["/usr/local/bin/ithacad"]', self.instructions)
        self.assertIn(f"USER {pod['securityContext']['runAsUser']}", self.instructions)
        self.assertIn("useradd --uid 10001 --gid 10001", self.text)
        # The image's own default command is as safe as the manifest's.
        (cmd,) = [json.loads(l[4:]) for l in self.instructions if l.startswith("CMD ")]
        for flag in ("--auth-token-file", "--tls-cert", "--tls-key", "--allowed-roots"):
            self.assertTrue([a for a in cmd if a.startswith(flag + "=")], flag)
        self.assertNotIn("--insecure", cmd)
        exposed = [l for l in self.instructions if l.startswith("EXPOSE ")][0].split()[1:]
        self.assertEqual(sorted(int(p) for p in exposed),
                         sorted(p["containerPort"] for p in c["ports"]))


class Prometheus(unittest.TestCase):
    def test_scrape_config_needs_no_honor_labels(self):
        (cfg,) = load_docs("deploy/prometheus/prometheus.yml")
        jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
        self.assertNotIn("honor_labels", jobs["ithacad"])
        for f in cfg["rule_files"]:
            self.assertTrue(os.path.isfile(os.path.join("deploy/prometheus", f)), f)

    def test_rules(self):
        rules = {}
        for path in glob.glob("deploy/prometheus/*.rules.yml"):
            for g in load_docs(path)[0]["groups"]:
                for r in g["rules"]:
                    rules[r.get("record") or r.get("alert")] = r
        for record in ("job_id:ithaca_tokens_per_second:sum", "job_id:ithaca_mfu_ratio:avg"):
            self.assertIn(record, rules)
        self.assertEqual(rules["job_id:ithaca_tokens_per_second:sum"]["expr"],
                         "sum by (job_id) (ithaca_tokens_per_second)")
        self.assertEqual(rules["job_id:ithaca_mfu_ratio:avg"]["expr"],
                         "avg by (job_id) (ithaca_mfu_ratio)")
        for alert in ("IthacaJobStalled", "IthacaGPUMemoryNearCapacity", "IthacaWorkerExited",
                      "IthacaJobFailed", "IthacadDown"):
            self.assertIn("severity", rules[alert]["labels"], alert)
            self.assertIn("summary", rules[alert]["annotations"], alert)
        self.assertIn("DCGM_FI_DEV_FB_FREE", rules["IthacaGPUMemoryNearCapacity"]["expr"])


class Grafana(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open("deploy/grafana/ithaca.json") as f:
            cls.d = json.load(f)
        cls.panels = [p for p in cls.d["panels"] if p["type"] != "row"]
        cls.vars = {v["name"]: v for v in cls.d["templating"]["list"]}

    def test_schema_and_variables(self):
        self.assertGreaterEqual(self.d["schemaVersion"], 36)
        self.assertEqual(self.vars["datasource"]["type"], "datasource")
        self.assertEqual(self.vars["datasource"]["query"], "prometheus")
        self.assertEqual(self.vars["job_id"]["definition"],
                         "label_values(ithaca_train_step, job_id)")
        self.assertRegex(self.vars["rank"]["definition"], r"^label_values\(.*\$job_id.*, rank\)$")
        for name in ("job_id", "rank"):
            v = self.vars[name]
            self.assertEqual(v["query"]["query"], v["definition"])
            self.assertEqual(v["allValue"], ".*")  # regex matchers below use =~

    def test_panels_use_the_datasource_variable(self):
        ds = {"type": "prometheus", "uid": "${datasource}"}
        ids = [p["id"] for p in self.d["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        for p in self.panels:
            self.assertEqual(p["datasource"], ds, p["title"])
            self.assertTrue(p["targets"], p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"], ds, p["title"])
                self.assertTrue(t["expr"].strip(), p["title"])
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            if "repeat" in p:
                self.assertIn(p["repeat"], self.vars)

    def test_covers_the_issue(self):
        exprs = [t["expr"] for p in self.panels for t in p["targets"]]
        joined = "\n".join(exprs)
        for needle in ("ithaca_gpu_memory_bytes{", "ithaca_gpu_memory_peak_bytes",
                       "ithaca_tokens_per_second{", "job_id:ithaca_tokens_per_second:sum",
                       "ithaca_train_loss", "ithaca_mfu_ratio", "ithaca_jobs",
                       "histogram_quantile(0.9, sum by (job_id, le) (rate(ithaca_step_duration_seconds_bucket",
                       "ithaca_eval_loss{", "ithaca_checkpoint_seconds{", "ithaca_queue_wait_seconds",
                       # issue 54 F10: passkey and every host tier; F3: the mix per source.
                       "ithaca_passkey_accuracy{", "ithaca_host_block_inputs_bytes{",
                       "ithaca_host_optimizer_bytes{", "ithaca_host_params_bytes{",
                       "ithaca_source_loss{", "ithaca_source_samples_total{"):
            self.assertIn(needle, joined)
        dcgm = [e for e in exprs if "DCGM_" in e]
        self.assertGreaterEqual(len(dcgm), 4)
        for e in dcgm:
            self.assertRegex(e, r"on \(UUID\) group_(left|right)")
        (mem,) = [p for p in self.panels if p["targets"][0]["expr"].startswith(
            "ithaca_gpu_memory_bytes{")]
        self.assertEqual(mem["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"], "normal")
        self.assertEqual(mem["repeat"], "rank")
        self.assertIn("{{tier}}", mem["targets"][0]["legendFormat"])
        # Job states over time: a stacked time series, not only the current counts.
        (states,) = [p for p in self.panels if p["type"] == "timeseries"
                     and p["targets"][0]["expr"] == "sum by (state) (ithaca_jobs)"]
        self.assertEqual(states["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"], "normal")
        # No expression depends on the scrape's `job` label for the training job.
        for e in exprs:
            self.assertNotRegex(e, r"(?<![\w:])job(?![\w:])", e)


if __name__ == "__main__":
    unittest.main(verbosity=2)
