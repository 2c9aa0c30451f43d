#include "server/ithacad_flags.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "engine/core/file_util.h"
#include "engine/core/flag_spelling.h"
#include "engine/core/path_policy.h"
#include "engine/spec/job_spec.h"
#include "launch/layout.h"
#include "launch/rpc_text.h"
#include "proto/version.h"
#include "server/auth.h"
#include "server/jobs.h"
#include "server/services.h"
#include "server/slurm.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "JobService address: host:port (port 0 picks one) or unix:/path");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Prometheus /metrics address (host:port; port 0 picks one; empty: off)");
ABSL_FLAG(std::string, state_dir, "",
          "Job store, logs and sockets; default $ITHACA_HOME, else ~/.ithaca");
ABSL_FLAG(std::string, gpus, "auto",
          "GPUs on this node (one rank each): auto (every GPU nvidia-smi lists; none: a CPU "
          "node), a number, or 0 (a CPU node)");
ABSL_FLAG(int, cpu_slots, 8, "Ranks a CPU node offers (when it has no GPUs)");
ABSL_FLAG(double, gpu_memory_gib, 0, "Memory per GPU when nvidia-smi cannot tell (default 80)");
ABSL_FLAG(std::string, worker_binary, "",
          "ithaca-worker; default: next to ithacad, or ../worker/ithaca-worker");
ABSL_FLAG(std::string, worker_socket, "",
          "WorkerService unix socket; default <state-dir>/run/worker.sock (run/ is 0700)");
ABSL_FLAG(double, heartbeat_timeout_s, 30, "A worker silent this long fails its job");
ABSL_FLAG(int, heartbeat_interval_ms, 1000, "How often workers heart-beat");
ABSL_FLAG(double, grace_period_s, 10, "Cancel: SIGTERM, then SIGKILL after this long");
ABSL_FLAG(double, start_timeout_s, 120, "Launch → every rank registered, or the job fails");
ABSL_FLAG(std::string, auth_token_file, "",
          "Bearer token every JobService call must carry (file mode 600, >= 16 bytes)");
ABSL_FLAG(std::string, tls_cert, "", "TLS certificate chain (PEM) for --listen; needs --tls-key");
ABSL_FLAG(std::string, tls_key, "", "TLS private key (PEM, file mode 600)");
ABSL_FLAG(bool, insecure, false,
          "Allow a --listen address other machines can reach without a token or TLS");
ABSL_FLAG(std::string, health_listen, "",
          "Also serve grpc.health.v1 alone, plaintext and without a token, here (host:port; for "
          "Kubernetes' gRPC probes, which speak no TLS); empty: off");
ABSL_FLAG(std::string, allowed_roots, "",
          "DIR[:DIR...]: every path a job spec reads or writes must resolve inside one; default "
          "the state directory and $HOME");
ABSL_FLAG(std::string, worker_user, "",
          "When ithacad runs as root: the user (name or uid) workers run as");
ABSL_FLAG(double, daemon_lost_timeout_s, 300,
          "Workers train on this long without a daemon (one restarting), waiting to re-attach");
ABSL_FLAG(bool, stop_jobs_on_exit, false,
          "SIGTERM / SIGINT fail the running jobs; default: they go on, and the next ithacad on "
          "this state directory adopts them");
ABSL_FLAG(bool, drain_on_exit, false,
          "SIGTERM / SIGINT first ask running jobs that can resume to checkpoint and stop, and "
          "queue them again for the next ithacad; the others are left running");
ABSL_FLAG(double, drain_timeout_s, 300, "--drain-on-exit: how long to wait for the checkpoints");
ABSL_FLAG(std::string, cluster, "local",
          "Where jobs run: local (ranks forked on this node) or slurm (each job an sbatch of one "
          "task per node; ranks report over TCP to --listen; docs/jobs.md)");
ABSL_FLAG(std::string, slurm_partition, "", "--cluster slurm: sbatch --partition by default");
ABSL_FLAG(std::string, slurm_account, "", "--cluster slurm: sbatch --account by default");
ABSL_FLAG(std::string, slurm_time_limit, "", "--cluster slurm: sbatch --time by default");
ABSL_FLAG(std::string, slurm_constraint, "", "--cluster slurm: sbatch --constraint by default");
ABSL_FLAG(int32_t, slurm_signal_grace, 120,
          "--cluster slurm: sbatch --signal=USR1@N: seconds of warning before a job's time limit "
          "(and on preemption) in which it checkpoints, stops and is queued again; 0: none; a "
          "job's [slurm] signal_grace overrides it");
ABSL_FLAG(std::string, worker_address, "",
          "--cluster slurm: host:port the ranks on the nodes dial (the --listen port); default "
          "--listen's, with this machine's host name for 0.0.0.0 / [::]");
ABSL_FLAG(std::string, worker_ca, "",
          "--cluster slurm: the CA (PEM) the ranks verify --tls-cert with, at this path on every "
          "node");
ABSL_FLAG(double, slurm_poll_s, 1, "--cluster slurm: how often squeue is asked about each job");
ABSL_FLAG(double, max_plan_seconds, 30,
          "The most time one submission's or plan's memory planning may take (big models at long "
          "lengths on a busy node may need more)");
ABSL_FLAG(bool, allow_root_workers, false,
          "When ithacad runs as root without --worker-user: run workers as root anyway");

namespace ithaca {
namespace {

std::string Dirname(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

std::string DefaultWorkerBinary() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "ithaca-worker";
  const std::string dir = Dirname(std::string(buf, n));
  for (const std::string& c : {dir + "/ithaca-worker", dir + "/../worker/ithaca-worker"}) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return dir + "/ithaca-worker";
}

// The user workers run as: none (the daemon's own) unless ithacad is root, which must not run
// other people's jobs as root by accident.
absl::StatusOr<std::optional<RunAs>> WorkerUser() {
  const std::string name = absl::GetFlag(FLAGS_worker_user);
  if (geteuid() != 0) {
    if (!name.empty()) {
      return absl::InvalidArgumentError(
          "--worker-user: ithacad is not root and cannot change its workers' user");
    }
    return std::nullopt;
  }
  if (name.empty()) {
    if (absl::GetFlag(FLAGS_allow_root_workers)) return std::nullopt;
    return absl::FailedPreconditionError(
        "ithacad runs as root: give --worker-user NAME (workers run as that user) or "
        "--allow-root-workers (workers run as root too); better, run ithacad as a normal user");
  }
  absl::StatusOr<RunAs> user = LookUpRunAs(name);
  if (!user.ok()) {
    return absl::Status(user.status().code(),
                        absl::StrCat("--worker-user: ", user.status().message()));
  }
  return std::optional<RunAs>(*std::move(user));
}

// A directory only the daemon (and its worker user) may enter: the WorkerService socket inside
// it takes no token.
absl::Status MakePrivateDir(const std::string& dir, const std::optional<RunAs>& owner) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat("mkdir ", dir, ": ", strerror(errno)));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, ": not a directory"));
  }
  const uid_t uid = owner ? owner->uid : geteuid();
  const gid_t gid = owner ? owner->gid : getegid();
  // One made by someone else (under /tmp, say) may hold their links or sockets: not ours.
  if (st.st_uid != uid && st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": belongs to uid ", st.st_uid, ", not to this daemon; remove it"));
  }
  if ((st.st_uid != uid || st.st_gid != gid) && chown(dir.c_str(), uid, gid) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("chown ", dir, ": ", strerror(errno)));
  }
  if (chmod(dir.c_str(), 0700) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("chmod 700 ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

// The state directory: --state-dir, else the default; created, and made absolute.
absl::StatusOr<std::string> StateDirFromFlags() {
  std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) state_dir = DefaultStateDir();
  // Other users may pass through (a --worker-user's workers reach their socket and log
  // directory) but not list or read it: every job's spec, reasons and history are in there.
  mkdir(state_dir.c_str(), 0711);
  char real[PATH_MAX];
  if (realpath(state_dir.c_str(), real) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--state-dir ", state_dir, ": ", strerror(errno)));
  }
  struct stat st;
  if (stat(real, &st) == 0 && st.st_uid == geteuid() && (st.st_mode & 0066) != 0) {
    chmod(real, st.st_mode & 07711);  // an older daemon's 0755: take group and others' reads away
  }
  return std::string(real);
}

// --allowed-roots, else the state directory and $HOME.
absl::StatusOr<std::vector<std::string>> AllowedRootsFromFlags(const std::string& state_dir) {
  std::string roots_flag = absl::GetFlag(FLAGS_allowed_roots);
  if (roots_flag.empty()) {
    roots_flag = state_dir;
    // A user without a home directory (a container's uid) often has HOME=/: that is no bound.
    const char* home = std::getenv("HOME");
    char real_home[PATH_MAX];
    if (home && *home && realpath(home, real_home) != nullptr && std::string(real_home) != "/") {
      absl::StrAppend(&roots_flag, ":", real_home);
    }
  }
  return ParseAllowedRoots(roots_flag);
}

// The supervisor's settings: the worker binary, socket, user and timeouts.
absl::StatusOr<Supervisor::Options> SupervisorOptionsFromFlags(const std::string& state_dir) {
  Supervisor::Options so;
  ASSIGN_OR_RETURN(so.run_as, WorkerUser());
  so.worker_binary = absl::GetFlag(FLAGS_worker_binary);
  if (so.worker_binary.empty()) so.worker_binary = DefaultWorkerBinary();
  so.worker_socket = absl::GetFlag(FLAGS_worker_socket);
  if (so.worker_socket.empty()) {
    std::string socket_dir = WorkerSocketDir(state_dir);
    // sockaddr_un holds 108 bytes; deep state directories get a short path under /tmp.
    if (socket_dir.size() > 90) {
      socket_dir = absl::StrCat("/tmp/ithacad-", std::hash<std::string>()(state_dir));
    }
    RETURN_IF_ERROR(MakePrivateDir(socket_dir, so.run_as));
    so.worker_socket = WorkerSocketPath(socket_dir);
  }
  so.heartbeat_timeout = absl::Seconds(absl::GetFlag(FLAGS_heartbeat_timeout_s));
  so.heartbeat_interval_ms = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  so.grace_period = absl::Seconds(absl::GetFlag(FLAGS_grace_period_s));
  so.start_timeout = absl::Seconds(absl::GetFlag(FLAGS_start_timeout_s));
  so.daemon_lost_timeout = absl::Seconds(absl::GetFlag(FLAGS_daemon_lost_timeout_s));
  return so;
}

// This node's GPUs (or CPU slots), and on a GPU node the libraries its workers load.
absl::StatusOr<Node> NodeFromFlags(const std::string& worker_binary) {
  int gpus = NodeOptions::kAutoGpus;
  if (const std::string g = absl::GetFlag(FLAGS_gpus);
      g != "auto" && (!absl::SimpleAtoi(g, &gpus) || gpus < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpus: expected auto or a number >= 0, got \"", g, "\""));
  }
  Node node =
      DetectNode({gpus, absl::GetFlag(FLAGS_cpu_slots), absl::GetFlag(FLAGS_gpu_memory_gib)});
  if (node.gpu) {
    // What the workers will load: asked of the worker binary itself (ithacad links no CUDA).
    const std::string command = "'" + worker_binary + "' --libraries 2>&1";
    if (FILE* p = popen(command.c_str(), "r")) {
      char line[1024] = {0};
      if (std::fgets(line, sizeof(line), p) != nullptr) {
        node.libraries = std::string(absl::StripTrailingAsciiWhitespace(line));
      }
      pclose(p);
    }
  }
  return node;
}

// --cluster: local, or slurm with its defaults and the address the nodes' ranks dial.
absl::Status ClusterFromFlags(const std::string& listen, Supervisor::Options* so) {
  const std::string cluster = absl::GetFlag(FLAGS_cluster);
  if (cluster == "local") return absl::OkStatus();
  if (cluster != "slurm") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cluster: expected local or slurm, got \"", cluster, "\""));
  }
  if (so->run_as) {
    return absl::InvalidArgumentError(
        "--worker-user with --cluster slurm: Slurm runs the jobs as the user who submits them, "
        "ithacad's own; run ithacad as that user instead");
  }
  if (listen.rfind("unix:", 0) == 0) {
    return absl::InvalidArgumentError(
        "--cluster slurm: --listen must be host:port (the nodes' ranks report to it over TCP)");
  }
  SlurmDefaults d;
  d.partition = absl::GetFlag(FLAGS_slurm_partition);
  d.account = absl::GetFlag(FLAGS_slurm_account);
  d.time_limit = absl::GetFlag(FLAGS_slurm_time_limit);
  d.constraint = absl::GetFlag(FLAGS_slurm_constraint);
  d.signal_grace_s = absl::GetFlag(FLAGS_slurm_signal_grace);
  if (d.signal_grace_s < 0 || d.signal_grace_s > 86400) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm-signal-grace: must be in 0..86400, got ", d.signal_grace_s));
  }
  // The same rules as the spec's [slurm] keys: the values go on #SBATCH lines.
  RETURN_IF_ERROR(CheckSlurmValue("slurm.partition", d.partition, "--slurm-partition"));
  RETURN_IF_ERROR(CheckSlurmValue("slurm.account", d.account, "--slurm-account"));
  RETURN_IF_ERROR(CheckSlurmValue("slurm.time_limit", d.time_limit, "--slurm-time-limit"));
  RETURN_IF_ERROR(CheckSlurmValue("slurm.constraint", d.constraint, "--slurm-constraint"));
  absl::StatusOr<CommandResult> version =
      RunCommand({"sbatch", "--version"}, {}, absl::Seconds(10));
  if (!version.ok() || version->exit_code != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--cluster slurm: cannot run sbatch (",
                     version.ok() ? absl::StrCat("exit code ", version->exit_code)
                                  : std::string(version.status().message()),
                     "); install Slurm's client commands, or set PATH and SLURM_CONF"));
  }
  so->slurm = d;
  so->cluster_poll_interval = absl::Seconds(absl::GetFlag(FLAGS_slurm_poll_s));
  so->worker_address = absl::GetFlag(FLAGS_worker_address);
  if (so->worker_address.empty()) {
    const size_t colon = listen.rfind(':');
    std::string host = listen.substr(0, colon);
    if (host == "0.0.0.0" || host == "[::]" || host == "::" || host.empty()) {
      char name[256] = {};
      gethostname(name, sizeof(name) - 1);
      host = name;
    }
    so->worker_address = absl::StrCat(host, listen.substr(colon));
  }
  so->worker_token_file = absl::GetFlag(FLAGS_auth_token_file);
  so->worker_ca_file = absl::GetFlag(FLAGS_worker_ca);
  if (!absl::GetFlag(FLAGS_tls_cert).empty() && so->worker_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--cluster slurm with --tls-cert: --worker-ca names the CA the nodes' ranks verify it "
        "with");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DaemonOptions> OptionsFromFlags() {
  DaemonOptions o;
  // Security settings first: a daemon that would be open to the network does not start at all.
  o.listen = absl::GetFlag(FLAGS_listen);
  ASSIGN_OR_RETURN(o.security,
                   LoadServerSecurity({o.listen, absl::GetFlag(FLAGS_auth_token_file),
                                       absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                                       absl::GetFlag(FLAGS_insecure)}));
  // A ":0" port is chosen here: gRPC would open a second, unannounced listener for it.
  ASSIGN_OR_RETURN(o.listen, ChooseListenPort(o.listen));
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.health_listen = absl::GetFlag(FLAGS_health_listen);
  // Its ":0" too: the port chosen is then written to ithacad.addr (health=), as grpc= is.
  if (!o.health_listen.empty()) {
    ASSIGN_OR_RETURN(o.health_listen, ChooseListenPort(o.health_listen));
  }
  o.stop_jobs_on_exit = absl::GetFlag(FLAGS_stop_jobs_on_exit);
  o.drain_on_exit = absl::GetFlag(FLAGS_drain_on_exit);
  o.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  if (o.stop_jobs_on_exit && o.drain_on_exit) {
    return absl::InvalidArgumentError("--stop-jobs-on-exit and --drain-on-exit: choose one");
  }
  ASSIGN_OR_RETURN(o.state_dir, StateDirFromFlags());
  o.jobs.state_dir = o.state_dir;
  ASSIGN_OR_RETURN(o.jobs.allowed_roots, AllowedRootsFromFlags(o.state_dir));
  const double plan_s = absl::GetFlag(FLAGS_max_plan_seconds);
  if (!(plan_s >= 1 && plan_s <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-plan-seconds: between 1 and 3600, got ", plan_s));
  }
  o.jobs.max_plan_time = absl::Seconds(plan_s);
  ASSIGN_OR_RETURN(o.jobs.supervisor, SupervisorOptionsFromFlags(o.state_dir));
  ASSIGN_OR_RETURN(o.jobs.node, NodeFromFlags(o.jobs.supervisor.worker_binary));
  RETURN_IF_ERROR(ClusterFromFlags(o.listen, &o.jobs.supervisor));
  return o;
}

// gRPC says only that it failed, and with TLS that is the key and the certificate disagreeing.
absl::Status ListenFailure(const std::string& listen, bool tls) {
  if (!tls) return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  const std::string cert = absl::GetFlag(FLAGS_tls_cert), key = absl::GetFlag(FLAGS_tls_key);
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot serve TLS on ", listen, ": gRPC refused --tls-cert ", cert, " with --tls-key ", key,
      "; does the key belong to the certificate? (`openssl x509 -noout -pubkey -in ", cert,
      "` and `openssl pkey -pubout -in ", key, "` print the same key when it does)"));
}
}  // namespace ithaca
