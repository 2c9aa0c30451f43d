#include "worker/local_launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/comm/rank_env.h"
#include "engine/core/file_util.h"
#include "launch/exit_codes.h"
#include "launch/layout.h"
#include "worker/node_link.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

// Signal forwarding: the handler records the signal and wakes the supervision loop through a
// self-pipe. One launch at a time may forward signals.
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_drain = 0;  // SIGUSR1 (LaunchOptions::forward_drain)
int g_wake_fd = -1;
std::atomic<bool> g_forwarding{false};

void Wake() {
  const int saved = errno;
  if (g_wake_fd >= 0) {
    char c = 0;
    ssize_t ignored = write(g_wake_fd, &c, 1);
    (void)ignored;
  }
  errno = saved;
}

void OnSignal(int sig) {
  g_signal = sig;
  Wake();
}

void OnDrainSignal(int) {
  g_drain = 1;
  Wake();
}

// A rank exited: reap it at once, so the rank that failed first is seen before the ones that
// fail because of it.
void OnChild(int) { Wake(); }

// A rank's process and the pipes carrying its output (ranks > 0 without a log directory).
struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int out = -1, err = -1;          // read ends, -1 when closed
  std::string out_line, err_line;  // partial lines
};

// Forwards what is readable on `*fd` to `dest`, each line prefixed; closes `*fd` at EOF.
void Pump(int* fd, std::string* partial, int dest, const std::string& prefix) {
  char buf[65536];
  ssize_t n = read(*fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    if (!partial->empty()) {
      std::string line = prefix + *partial + "\n";
      WriteAllToFd(dest, line.data(), line.size());
      partial->clear();
    }
    close(*fd);
    *fd = -1;
    return;
  }
  partial->append(buf, static_cast<size_t>(n));
  size_t start = 0;
  std::string lines;
  for (size_t nl = partial->find('\n'); nl != std::string::npos; nl = partial->find('\n', start)) {
    absl::StrAppend(&lines, prefix, absl::string_view(*partial).substr(start, nl + 1 - start));
    start = nl + 1;
  }
  partial->erase(0, start);
  WriteAllToFd(dest, lines.data(), lines.size());
}

// Restores signal handlers, closes descriptors and removes the rendezvous directory however
// LaunchLocal returns.
class Cleanup {
 public:
  ~Cleanup() {
    if (forwarding) {
      sigaction(SIGINT, &old_int, nullptr);
      sigaction(SIGTERM, &old_term, nullptr);
      sigaction(SIGCHLD, &old_chld, nullptr);
      g_wake_fd = -1;
      g_signal = 0;
      g_forwarding = false;
    }
    if (drain) {
      sigaction(SIGUSR1, &old_usr1, nullptr);
      g_drain = 0;
    }
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
    for (const Child& c : children) {
      if (c.out >= 0) close(c.out);
      if (c.err >= 0) close(c.err);
    }
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  bool forwarding = false;
  bool drain = false;  // SIGUSR1 forwarded too
  struct sigaction old_int = {}, old_term = {}, old_chld = {}, old_usr1 = {};
  std::vector<int> fds;
  std::vector<Child> children;  // the read ends of their output pipes still open
  std::string dir;
};

}  // namespace

std::string RankExit::ToString() const { return absl::StrCat("rank ", rank, " ", end.Describe()); }

int LaunchReport::ExitCode() const {
  if (first_failure >= 0) return ranks[first_failure].end.ShellCode();
  if (forwarded_signal != 0) return 128 + forwarded_signal;
  return remote_failure.empty() ? 0 : kExitError;
}

namespace {

absl::Status CheckLaunchOptions(const LaunchOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("launcher: no command");
  if (options.nproc < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher: --nproc must be at least 1, got ", options.nproc));
  }
  if (!options.gpus.empty() && static_cast<int>(options.gpus.size()) != options.nproc) {
    return absl::InvalidArgumentError(absl::StrCat("launcher: ", options.gpus.size(),
                                                   " GPUs listed for ", options.nproc, " ranks"));
  }

  if (options.nnodes < 1 || options.node_rank < 0 || options.node_rank >= options.nnodes) {
    return absl::InvalidArgumentError(absl::StrCat("launcher: --node-rank ", options.node_rank,
                                                   " is not a node of --nnodes ", options.nnodes));
  }
  if (options.nnodes > 1 && options.rendezvous.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher: ", options.nnodes, " nodes need --rendezvous tcp:HOST:PORT"));
  }
  return absl::OkStatus();
}

// One machine: a file rendezvous in a fresh directory, which `cleanup` removes.
absl::Status MakeRendezvousDir(const LaunchOptions& options, Cleanup& cleanup) {
  std::string tmp = options.temp_dir;
  if (tmp.empty()) tmp = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string dir_template = tmp + "/ithaca-rdzv-XXXXXX";
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("launcher: cannot create a rendezvous directory in ",
                                            tmp, ": ", std::strerror(errno)));
  }
  cleanup.dir = dir_template;
  return absl::OkStatus();
}

// SIGUSR1 (a drain) is recorded from now on, and forwarded once the ranks run: a warning that
// comes while the nodes join the rendezvous must not kill the launcher. Idempotent.
void TakeDrainSignal(Cleanup& cleanup) {
  if (cleanup.drain) return;
  struct sigaction usr1 = {};
  usr1.sa_handler = OnDrainSignal;
  sigemptyset(&usr1.sa_mask);
  usr1.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &usr1, &cleanup.old_usr1);
  cleanup.drain = true;
}

// SIGINT / SIGTERM (and, with `drain`, SIGUSR1) are forwarded to the ranks, SIGCHLD wakes the
// loop (through a pipe whose read end is cleanup.fds[0]); `cleanup` restores the old handlers.
absl::Status ForwardSignals(Cleanup& cleanup, bool drain) {
  if (g_forwarding.exchange(true)) {
    return absl::FailedPreconditionError(
        "launcher: another launch in this process already forwards signals");
  }
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    g_forwarding = false;
    return absl::InternalError(absl::StrCat("launcher: pipe: ", std::strerror(errno)));
  }
  cleanup.fds = {wake[0], wake[1]};
  g_signal = 0;
  g_wake_fd = wake[1];
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, &cleanup.old_int);
  sigaction(SIGTERM, &sa, &cleanup.old_term);
  struct sigaction child = sa;
  child.sa_handler = OnChild;
  child.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &child, &cleanup.old_chld);
  if (drain) TakeDrainSignal(cleanup);
  cleanup.forwarding = true;
  return absl::OkStatus();
}

// Where each rank's output goes: rank 0 to the launcher's own descriptors; the others to their
// log files, or to pipes the loop prefixes "[rank r] " onto. The ranks' write ends are left in
// `write_ends`, for the caller to close once the ranks hold them (a rank's exit is then its
// pipes' end of file).
absl::Status ConnectOutputs(const LaunchOptions& options, int first_rank,
                            std::vector<Child>& children, LaunchSpec& spec,
                            std::vector<int>& write_ends) {
  auto fail = [&write_ends] {
    for (int fd : write_ends) close(fd);
    write_ends.clear();
    return absl::InternalError(absl::StrCat("launcher: pipe: ", std::strerror(errno)));
  };
  for (int r = 0; r < options.nproc; ++r) {
    children[r].rank = r;
    RankOutput output;
    output.out_fd = options.out_fd;
    output.err_fd = options.err_fd;
    if (r > 0 && !options.log_dir.empty()) {
      output.log_path = RankLogPath(options.log_dir, first_rank + r);
    } else if (r > 0) {
      int out[2], err[2];
      if (pipe2(out, O_CLOEXEC) != 0) return fail();
      children[r].out = out[0];
      write_ends.push_back(out[1]);
      if (pipe2(err, O_CLOEXEC) != 0) return fail();
      children[r].err = err[0];
      write_ends.push_back(err[1]);
      output.out_fd = out[1];
      output.err_fd = err[1];
    }
    spec.outputs.push_back(output);
  }
  return absl::OkStatus();
}

// Supervises one node's ranks until every one has ended and its output is drained: forwards
// their output, reaps them, and stops them all (SIGTERM, then SIGKILL after the grace period) on
// the first failure, another node's failure, or a signal the launcher forwards.
class LocalSupervision {
 public:
  LocalSupervision(const LaunchOptions& options, int first_rank, pid_t pgid, int wake_read,
                   std::vector<Child>& children, NodeLink* link, LaunchReport& rep)
      : options_(options),
        first_rank_(first_rank),
        pgid_(pgid),
        wake_read_(wake_read),
        children_(children),
        link_(link),
        rep_(rep) {}

  void Run() {
    while (true) {
      bool any_running = false, any_pipe = false;
      for (const Child& c : children_) {
        any_running |= c.running;
        any_pipe |= c.out >= 0 || c.err >= 0;
      }
      if (!any_running && !any_pipe) return;
      ForwardOutput(any_running);
      Reap();
      WatchOtherNodes();
      TakeSignal();
      if (stopping_ && !killed_ && Clock::now() > grace_deadline_) {
        StopAll(SIGKILL);
        killed_ = true;
      }
    }
  }

 private:
  // Waits (up to a poll interval) for output or a wake-up, and forwards what came.
  void ForwardOutput(bool any_running) {
    std::vector<pollfd> fds;
    if (wake_read_ >= 0) fds.push_back({wake_read_, POLLIN, 0});
    for (const Child& c : children_) {
      if (c.out >= 0) fds.push_back({c.out, POLLIN, 0});
      if (c.err >= 0) fds.push_back({c.err, POLLIN, 0});
    }
    // Once every rank is reaped, only drain what is already buffered: a grandchild that kept a
    // pipe open must not hold the launcher.
    const int timeout_ms = any_running ? (options_.forward_signals ? 100 : 20) : 0;
    const int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready > 0) {
      for (const pollfd& p : fds) {
        if (p.revents == 0) continue;
        if (p.fd == wake_read_) {
          char buf[64];
          while (read(wake_read_, buf, sizeof(buf)) > 0) {
          }
          continue;
        }
        for (Child& c : children_) {
          const std::string prefix = absl::StrCat("[rank ", first_rank_ + c.rank, "] ");
          if (p.fd == c.out) Pump(&c.out, &c.out_line, options_.out_fd, prefix);
          if (p.fd == c.err) Pump(&c.err, &c.err_line, options_.err_fd, prefix);
        }
      }
    } else if (!any_running) {
      for (Child& c : children_) {
        for (int* fd : {&c.out, &c.err}) {
          if (*fd >= 0) {
            close(*fd);
            *fd = -1;
          }
        }
      }
    }
  }

  // Reaps ranks that ended; the first to fail (on its own) stops the others.
  void Reap() {
    for (Child& c : children_) {
      if (!c.running) continue;
      std::optional<WorkerEnd> end = Launcher::Poll(c.pid);
      if (!end) continue;
      c.running = false;
      RankExit& e = rep_.ranks[c.rank];
      e.end = *end;
      if (end->signaled && !e.stopped_by_launcher && rep_.forwarded_signal == 0 &&
          options_.on_rank_killed) {
        options_.on_rank_killed(first_rank_ + c.rank, *end);
      }
      // A drained rank checkpointed with its peers and stopped on purpose: no failure.
      const bool drained = options_.forward_drain && end->drained();
      rep_.drained |= drained;
      if (!end->ok() && !drained && rep_.first_failure < 0 && !e.stopped_by_launcher &&
          rep_.forwarded_signal == 0) {
        rep_.first_failure = c.rank;
        BeginStop(SIGTERM);
      }
    }
  }

  // Across nodes: says when this node failed, and stops when another one did.
  void WatchOtherNodes() {
    if (link_ == nullptr || !rep_.remote_failure.empty()) return;
    if (rep_.first_failure >= 0 && !reported_failure_) {
      reported_failure_ = true;
      rep_.remote_failure = link_->ReportFailure(rep_.ranks[rep_.first_failure].ToString());
    } else if (!stopping_) {
      rep_.remote_failure = link_->RemoteFailure();
      if (!rep_.remote_failure.empty()) BeginStop(SIGTERM);
    }
  }

  // A SIGINT / SIGTERM the launcher received: forwarded; a second one kills. A SIGUSR1 (a
  // drain) is forwarded as it is: the ranks decide together when to checkpoint and stop.
  void TakeSignal() {
    if (g_drain != 0 && options_.forward_drain) {
      g_drain = 0;
      if (!stopping_) Launcher::SignalGroup(pgid_, SIGUSR1);
    }
    if (g_signal == 0 || !options_.forward_signals) return;
    const int sig = g_signal;
    g_signal = 0;
    if (rep_.forwarded_signal == 0 && !stopping_) {
      rep_.forwarded_signal = sig;
      BeginStop(sig);
      if (link_ != nullptr) {
        link_->Announce(
            absl::StrCat("its launcher received ", SignalName(sig), " and stopped its ranks"));
      }
    } else {
      StopAll(SIGKILL);  // a second signal, or one during shutdown: no more waiting
      killed_ = true;
    }
  }

  void StopAll(int sig) {
    for (const Child& c : children_) {
      if (c.running) rep_.ranks[c.rank].stopped_by_launcher = true;
    }
    Launcher::SignalGroup(pgid_, sig);
  }

  void BeginStop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    grace_deadline_ = Clock::now() + std::chrono::milliseconds(
                                         static_cast<int64_t>(options_.grace_period_s * 1000.0));
    StopAll(sig);
  }

  const LaunchOptions& options_;
  const int first_rank_;
  const pid_t pgid_;
  const int wake_read_;
  std::vector<Child>& children_;
  NodeLink* const link_;
  LaunchReport& rep_;
  bool stopping_ = false;
  bool killed_ = false;
  bool reported_failure_ = false;
  Clock::time_point grace_deadline_ = Clock::now();
};

// The launch's result once every rank has ended (see LaunchLocal in launcher.h).
absl::Status LaunchOutcome(const LaunchOptions& options, const LaunchReport& rep, int first_rank,
                           NodeLink* link) {
  const std::string node = link != nullptr ? link->name() + ": " : "";
  if (!rep.remote_failure.empty() && rep.forwarded_signal == 0) {
    std::string message =
        absl::StrCat(rep.remote_failure, "; ", link->name(), " stopped its ", options.nproc,
                     " ranks (", first_rank, "..", first_rank + options.nproc - 1, ")");
    if (rep.first_failure >= 0) {
      absl::StrAppend(&message, "; here ", rep.ranks[rep.first_failure].ToString());
    }
    return absl::AbortedError(message);
  }
  if (rep.first_failure >= 0) {
    // Ranks that failed on their own after the first usually did so because of it; list them.
    std::vector<std::string> also;
    for (const RankExit& e : rep.ranks) {
      if (!e.end.ok() && e.rank != rep.first_failure && !e.stopped_by_launcher) {
        also.push_back(e.ToString());
      }
    }
    std::string message =
        absl::StrCat(node, rep.ranks[rep.first_failure].ToString(), " (first of ", options.nproc,
                     link != nullptr ? " ranks on this node" : " ranks", " to fail; the others ",
                     link != nullptr ? "on every node " : "", "were stopped");
    if (!also.empty()) absl::StrAppend(&message, "; then ", absl::StrJoin(also, ", "));
    return absl::AbortedError(message + ")");
  }
  if (rep.forwarded_signal != 0) {
    return absl::CancelledError(absl::StrCat("launcher received ", SignalName(rep.forwarded_signal),
                                             " and forwarded it to the ranks"));
  }
  if (link != nullptr) return link->Finish();
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchLocal(const LaunchOptions& options, LaunchReport* report) {
  LaunchReport local_report;
  LaunchReport& rep = report ? *report : local_report;
  rep = LaunchReport();
  RETURN_IF_ERROR(CheckLaunchOptions(options));
  const int first_rank = options.node_rank * options.nproc;
  const bool multinode = !options.rendezvous.empty();

  Cleanup cleanup;
  if (options.forward_signals && options.forward_drain) TakeDrainSignal(cleanup);
  std::unique_ptr<NodeLink> link;
  if (multinode) {
    ASSIGN_OR_RETURN(link, NodeLink::Join(options));
  } else {
    RETURN_IF_ERROR(MakeRendezvousDir(options, cleanup));
  }
  if (options.forward_signals) RETURN_IF_ERROR(ForwardSignals(cleanup, options.forward_drain));
  const int wake_read = options.forward_signals ? cleanup.fds[0] : -1;

  LaunchSpec spec;
  spec.argv = options.argv;
  spec.gpus = options.gpus;
  if (spec.gpus.empty()) {
    for (int r = 0; r < options.nproc; ++r) spec.gpus.push_back(r);
  }
  spec.rendezvous = multinode ? options.rendezvous : "file:" + cleanup.dir;
  spec.first_rank = first_rank;
  spec.world = options.nnodes * options.nproc;
  spec.drain_signal_blocked = options.forward_drain;
  spec.env = options.env;
  if (multinode) {
    // Gloo listens where the other nodes can reach it, unless told otherwise.
    bool gloo_host_set = std::getenv(kEnvGlooHost) != nullptr;
    for (const auto& [key, value] : options.env) gloo_host_set |= key == kEnvGlooHost;
    const std::string address = link->LocalAddress();
    if (!gloo_host_set && !address.empty()) spec.env.emplace_back(kEnvGlooHost, address);
  }
  std::vector<Child>& children = cleanup.children;
  children.resize(options.nproc);
  std::vector<int> write_ends;
  RETURN_IF_ERROR(ConnectOutputs(options, first_rank, children, spec, write_ends));
  absl::StatusOr<WorkerGroup> group = Launcher::Launch(spec);
  for (int fd : write_ends) close(fd);
  if (!group.ok()) return group.status();
  rep.ranks.resize(options.nproc);
  for (int r = 0; r < options.nproc; ++r) {
    children[r].pid = group->pids[r];
    children[r].running = true;
    rep.ranks[r].rank = first_rank + r;
    rep.ranks[r].pid = group->pids[r];
  }

  LocalSupervision(options, first_rank, group->pgid, wake_read, children, link.get(), rep).Run();
  return LaunchOutcome(options, rep, first_rank, link.get());
}

}  // namespace ithaca
