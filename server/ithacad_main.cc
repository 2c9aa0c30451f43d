// ithacad: the Ithaca job daemon. Takes training jobs over gRPC (JobService + grpc.health.v1),
// runs one ithaca-worker per GPU (or CPU slot), serves Prometheus metrics on /metrics, and keeps
// every job in SQLite under --state-dir. SIGTERM / SIGINT: stops serving and leaves running jobs
// to the next ithacad on the state directory, which adopts them (server/adoption.h).
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

#include "absl/flags/usage_config.h"
#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/flags/usage.h"
#include "engine/core/flag_spelling.h"
#include "engine/core/file_util.h"
#include "proto/version.h"
#include "server/auth.h"
#include "server/health_server.h"
#include "server/ithacad_flags.h"
#include "server/jobs.h"
#include "engine/core/path_policy.h"
#include "launch/rpc_text.h"
#include "server/services.h"
#include "server/slurm.h"
#include "engine/spec/job_spec.h"
#include "launch/layout.h"

namespace ithaca {
namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "ithacad: %s\n", st.ToString().c_str());
  return 1;
}

// One daemon per state directory: holds its lock for the life of the process.
absl::Status LockStateDir(const std::string& state_dir) {
  const std::string lock_path = StateLockPath(state_dir);
  // Only this daemon's user may open the lock (0600, and refused when another user owns it), so
  // no other local user can hold it to keep ithacad from starting.
  int lock_fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  struct stat st;
  if (lock_fd >= 0 && fstat(lock_fd, &st) == 0) {
    if (st.st_uid != geteuid()) {
      close(lock_fd);
      return absl::FailedPreconditionError(absl::StrCat(lock_path, " belongs to uid ", st.st_uid,
                                                        ", not to this daemon's user (uid ",
                                                        geteuid(), "): remove it"));
    }
    fchmod(lock_fd, 0600);
  }
  if (lock_fd < 0 || flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("another ithacad is using ", state_dir, " (", lock_path, " is locked)"));
  }
  return absl::OkStatus();
}

// The WorkerService on its unix socket, which only the daemon's (and its worker user's) own
// processes may reach.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartWorkerServer(const Supervisor::Options& so,
                                                                WorkerServiceImpl* service) {
  unlink(so.worker_socket.c_str());
  grpc::ServerBuilder wb;
  wb.AddListeningPort("unix:" + so.worker_socket, grpc::InsecureServerCredentials());
  wb.RegisterService(service);
  AddRpcBoundary(&wb);  // a request that is not UTF-8 gets INVALID_ARGUMENT saying so
  std::unique_ptr<grpc::Server> server = wb.BuildAndStart();
  if (!server) {
    return absl::UnavailableError(absl::StrCat("cannot listen on unix:", so.worker_socket));
  }
  // The socket's directory keeps others out; the socket itself is for its owner (the worker user
  // when there is one; root reaches it regardless).
  if ((so.run_as && chown(so.worker_socket.c_str(), so.run_as->uid, so.run_as->gid) != 0) ||
      chmod(so.worker_socket.c_str(), 0600) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot restrict ", so.worker_socket, ": ", strerror(errno)));
  }
  return server;
}

void PrintServing(const DaemonOptions& o, const std::string& address,
                  const std::string& metrics_address) {
  const Supervisor::Options& so = o.jobs.supervisor;
  std::printf(
      "ithacad: serving jobs on %s (%s), metrics on http://%s/metrics; %d %s; state in %s\n",
      address.c_str(), o.security.Describe().c_str(), metrics_address.c_str(), o.jobs.node.slots(),
      o.jobs.node.gpu ? "GPUs" : "CPU slots", o.state_dir.c_str());
  std::printf("ithacad: job paths must lie in %s; workers run as %s\n",
              absl::StrJoin(o.jobs.allowed_roots, ":").c_str(),
              so.run_as ? so.run_as->name.c_str() : "this daemon's user");
  if (!o.jobs.node.libraries.empty()) {
    std::printf("ithacad: workers load %s\n", o.jobs.node.libraries.c_str());
  }
  std::fflush(stdout);
}

// Blocks until SIGTERM or SIGINT (blocked by the caller, so every thread inherits the mask);
// meanwhile, a daemon whose state directory is deleted under it stops looking healthy: it stops
// admitting (JobStore::Create refuses) and `set_serving(false)` is called once.
int WaitForStopSignal(const sigset_t& stop_signals, JobStore* store,
                      const std::function<void(bool)>& set_serving) {
  std::atomic<bool> stopping{false};
  std::thread watch_store([&] {
    bool reported = false;
    while (!stopping.load()) {
      absl::Status intact = store->CheckIntact();
      if (!intact.ok() && !reported) {
        std::fprintf(stderr, "ithacad: %s\n", std::string(intact.message()).c_str());
        set_serving(false);
        reported = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  int sig = 0;
  sigwait(&stop_signals, &sig);
  stopping.store(true);
  watch_store.join();
  return sig;
}

// Runs the daemon until SIGTERM / SIGINT.

absl::Status Serve(DaemonOptions o) {
  RETURN_IF_ERROR(LockStateDir(o.state_dir));
  // Signals are taken synchronously (sigwait); every thread started below inherits the blocked
  // mask. Workers get a clean mask from the launcher.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                   JobStore::Open({JobStorePath(o.state_dir), JobDirsPath(o.state_dir)}));
  // Hostname on every series: the Kubernetes node (NODE_NAME, from the downward API's
  // spec.nodeName, as DCGM exporter's Hostname), else this machine's name.
  const char* node_name = std::getenv("NODE_NAME");
  Metrics metrics(node_name != nullptr && *node_name != 0 ? node_name : o.jobs.node.hostname);
  {
    std::vector<std::tuple<int, std::string, int64_t>> devices;
    for (const NodeDevice& d : o.jobs.node.devices) {
      if (o.jobs.node.gpu) devices.emplace_back(d.index, d.uuid, d.memory_bytes);
    }
    metrics.SetDevices(devices);
  }
  std::unique_ptr<MetricsHttp> http;
  std::atomic<Jobs*> jobs_ptr{nullptr};
  if (!o.metrics_listen.empty()) {
    ASSIGN_OR_RETURN(http, MetricsHttp::Start({o.metrics_listen, &metrics, [&jobs_ptr] {
                                                 if (Jobs* j = jobs_ptr.load())
                                                   j->RefreshJobCounts();
                                               }}));
    o.jobs.metrics_address = http->address();
  }
  Jobs jobs(o.jobs, store.get(), &metrics);
  RETURN_IF_ERROR(jobs.Start());
  jobs_ptr.store(&jobs);

  WorkerServiceImpl worker_service(jobs.supervisor());
  ASSIGN_OR_RETURN(std::unique_ptr<grpc::Server> worker_server,
                   StartWorkerServer(o.jobs.supervisor, &worker_service));

  grpc::EnableDefaultHealthCheckService(true);
  JobServiceImpl job_service(&jobs, o.security.authenticator);
  grpc::ServerBuilder jb;
  int port = 0;
  jb.AddListeningPort(o.listen, o.security.credentials, &port);
  jb.RegisterService(&job_service);
  // --cluster slurm: ranks on the nodes report here, with the clients' TLS and token and their
  // job's secret (services.h).
  WorkerServiceImpl remote_worker_service(jobs.supervisor(), o.security.authenticator);
  if (o.jobs.supervisor.slurm) jb.RegisterService(&remote_worker_service);
  AddRpcBoundary(&jb);
  RETURN_IF_ERROR(CheckListenAddress(o.listen));
  std::unique_ptr<grpc::Server> server = jb.BuildAndStart();
  if (!server) return ListenFailure(o.listen, o.security.tls);
  std::unique_ptr<HealthServer> health_server;
  if (!o.health_listen.empty()) {
    ASSIGN_OR_RETURN(health_server, HealthServer::Start(o.health_listen));
  }
  auto set_serving = [&](bool serving) {
    server->GetHealthCheckService()->SetServingStatus(serving);
    if (health_server) health_server->SetServing(serving);
  };
  std::string address = o.listen;
  if (o.listen.rfind("unix:", 0) != 0) {
    address = absl::StrCat(o.listen.substr(0, o.listen.rfind(':')), ":", port);
  }
  // Where to find this daemon, for scripts and tests (written once it serves).
  RETURN_IF_ERROR(
      WriteFileAtomic(DaemonAddrFilePath(o.state_dir),
                      absl::StrCat("grpc=", address, "\nmetrics=", o.jobs.metrics_address,
                                   o.health_listen.empty() ? "" : "\nhealth=", o.health_listen,
                                   "\npid=", getpid(), "\n")));
  chmod(DaemonAddrFilePath(o.state_dir).c_str(), 0600);  // the state directory's files: ours
  PrintServing(o, address, o.jobs.metrics_address);

  const int sig = WaitForStopSignal(stop_signals, store.get(), set_serving);
  std::printf("ithacad: %s: shutting down\n", strsignal(sig));
  std::fflush(stdout);
  set_serving(false);
  if (o.stop_jobs_on_exit) {
    jobs.Shutdown(absl::StrCat("daemon shut down (", strsignal(sig), ")"));
  } else {
    if (o.drain_on_exit) {
      const int drained = jobs.Drain(o.drain_timeout);
      std::printf("ithacad: drained %d job%s (checkpointed, queued again)\n", drained,
                  drained == 1 ? "" : "s");
    }
    const int left = jobs.Detach();
    if (left > 0) {
      std::printf("ithacad: left %d running job%s to the next ithacad on %s\n", left,
                  left == 1 ? "" : "s", o.state_dir.c_str());
    }
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  worker_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  health_server.reset();
  unlink(o.jobs.supervisor.worker_socket.c_str());
  unlink(DaemonAddrFilePath(o.state_dir).c_str());
  jobs_ptr.store(nullptr);
  http.reset();
  std::printf("ithacad: stopped\n");
  return absl::OkStatus();
}

int Run() {
  absl::StatusOr<DaemonOptions> options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  if (!options->security.warning.empty()) {
    std::fprintf(stderr, "ithacad: warning: %s\n", options->security.warning.c_str());
  }
  absl::Status served = Serve(*std::move(options));
  return served.ok() ? 0 : Fail(served);
}

}  // namespace
}  // namespace ithaca

namespace {

// absl's --help names flags as they are declared (--state_dir); this daemon's flags as they are
// typed (--state-dir), with their defaults.
void PrintHelp() {
  std::printf("ithacad: the Ithaca job daemon (see README.md)\n\nusage: ithacad [FLAGS]\n%s",
              ithaca::DashedFlagHelp("ithacad_flags").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ithacad: the Ithaca job daemon (see README.md)");
  {
    // --version: the number every program prints (proto/version.h), not absl's build kind.
    absl::FlagsUsageConfig usage;
    usage.version_string = [] {
      return absl::StrCat("ithacad ", ithaca::kIthacaVersion, " (API ithaca.v1)\n");
    };
    absl::SetFlagsUsageConfig(usage);
  }
  if (ithaca::AsksForHelp(argc, argv)) {
    PrintHelp();
    return 0;
  }
  // Flags are spelled with dashes on the command line (--state-dir); absl names them with
  // underscores (engine/core/flag_spelling.h; the old --state_dir still works, with a warning).
  ithaca::FlagSpelling flags = ithaca::NormalizeFlags("ithacad", argc, argv);
  std::vector<char*> fixed = flags.argv();
  absl::ParseCommandLine(static_cast<int>(fixed.size()), fixed.data());
  return ithaca::Run();
}
