#include "worker/local_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

// Signal forwarding: the handler records the signal and wakes the supervision loop through a
// self-pipe. One launch at a time may forward signals.
volatile sig_atomic_t g_signal = 0;
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

// A rank exited: reap it at once, so the rank that failed first is seen before the ones that
// fail because of it.
void OnChild(int) { Wake(); }

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

void WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere left to report it
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

// execve needs a path; resolving it here keeps the child between fork and exec to
// async-signal-safe calls.
absl::StatusOr<std::string> ResolveCommand(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("launcher: ", name, ": command not found in PATH"));
}

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
      WriteAll(dest, line.data(), line.size());
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
  WriteAll(dest, lines.data(), lines.size());
}

void WriteNumber(int fd, int value) {
  char digits[16];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0 && n < 16);
  char out[16];
  for (int i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  WriteAll(fd, out, static_cast<size_t>(n));
}

// In the child: only async-signal-safe calls until exec.
[[noreturn]] void ExecRank(pid_t parent, const std::string& path, char* const* argv,
                           char* const* envp, int out_fd, int err_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (out_fd != STDOUT_FILENO && dup2(out_fd, STDOUT_FILENO) < 0) _exit(127);
  if (err_fd != STDERR_FILENO && dup2(err_fd, STDERR_FILENO) < 0) _exit(127);
  execve(path.c_str(), argv, envp);
  int err = errno;
  static const char kMsg[] = "launcher: exec failed for ";
  WriteAll(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
  WriteAll(STDERR_FILENO, path.c_str(), path.size());
  WriteAll(STDERR_FILENO, ": errno ", 8);
  WriteNumber(STDERR_FILENO, err);
  WriteAll(STDERR_FILENO, "\n", 1);
  _exit(127);
}

// Restores signal handlers and removes the rendezvous directory however LaunchLocal returns.
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
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
    if (!dir.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  bool forwarding = false;
  struct sigaction old_int = {}, old_term = {}, old_chld = {};
  std::vector<int> fds;
  std::string dir;
};

}  // namespace

std::string RankExit::ToString() const {
  if (exited) return absl::StrCat("rank ", rank, " exited with code ", exit_code);
  return absl::StrCat("rank ", rank, " killed by ", SignalName(signal));
}

int LaunchReport::ExitCode() const {
  if (first_failure >= 0) {
    const RankExit& r = ranks[first_failure];
    return r.exited ? r.exit_code : 128 + r.signal;
  }
  return forwarded_signal != 0 ? 128 + forwarded_signal : 0;
}

absl::Status LaunchLocal(const LaunchOptions& options, LaunchReport* report) {
  LaunchReport local_report;
  LaunchReport& rep = report ? *report : local_report;
  rep = LaunchReport();
  if (options.argv.empty()) return absl::InvalidArgumentError("launcher: no command");
  if (options.nproc < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher: --nproc must be at least 1, got ", options.nproc));
  }
  if (!options.gpus.empty() && static_cast<int>(options.gpus.size()) != options.nproc) {
    return absl::InvalidArgumentError(absl::StrCat("launcher: ", options.gpus.size(),
                                                   " GPUs listed for ", options.nproc, " ranks"));
  }
  ASSIGN_OR_RETURN(std::string path, ResolveCommand(options.argv[0]));

  Cleanup cleanup;
  std::string tmp = options.temp_dir;
  if (tmp.empty()) tmp = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
  std::string dir_template = tmp + "/ithaca-rdzv-XXXXXX";
  if (mkdtemp(dir_template.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("launcher: cannot create a rendezvous directory in ",
                                            tmp, ": ", std::strerror(errno)));
  }
  cleanup.dir = dir_template;

  if (options.forward_signals) {
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
    cleanup.forwarding = true;
  }
  const int wake_read = options.forward_signals ? cleanup.fds[0] : -1;

  // Everything the children need, built before the first fork.
  std::vector<char*> argv;
  for (const std::string& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> base_env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "ITHACA_RANK=", 12) == 0 ||
        std::strncmp(*e, "ITHACA_WORLD_SIZE=", 18) == 0 ||
        std::strncmp(*e, "ITHACA_RENDEZVOUS=", 18) == 0 ||
        std::strncmp(*e, "ITHACA_GPU=", 11) == 0) {
      continue;
    }
    base_env.emplace_back(*e);
  }
  for (const auto& [key, value] : options.env) base_env.push_back(key + "=" + value);
  base_env.push_back(absl::StrCat("ITHACA_WORLD_SIZE=", options.nproc));
  base_env.push_back(absl::StrCat("ITHACA_RENDEZVOUS=file:", cleanup.dir));

  const pid_t self = getpid();
  std::vector<Child> children(options.nproc);
  rep.ranks.resize(options.nproc);
  absl::Status setup_error;
  for (int r = 0; r < options.nproc && setup_error.ok(); ++r) {
    Child& c = children[r];
    c.rank = r;
    rep.ranks[r].rank = r;
    std::vector<std::string> env = base_env;
    env.push_back(absl::StrCat("ITHACA_RANK=", r));
    env.push_back(absl::StrCat("ITHACA_GPU=", options.gpus.empty() ? r : options.gpus[r]));
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    int child_out = options.out_fd, child_err = options.err_fd;
    int close_after[2] = {-1, -1};
    if (r > 0 && !options.log_dir.empty()) {
      std::string log = absl::StrCat(options.log_dir, "/rank_", r, ".log");
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        setup_error = absl::InternalError(
            absl::StrCat("launcher: cannot open ", log, ": ", std::strerror(errno)));
        break;
      }
      child_out = child_err = close_after[0] = fd;
    } else if (r > 0) {
      int po[2], pe[2];
      if (pipe2(po, O_CLOEXEC) != 0 || pipe2(pe, O_CLOEXEC) != 0) {
        setup_error = absl::InternalError(absl::StrCat("launcher: pipe: ", std::strerror(errno)));
        break;
      }
      c.out = po[0];
      c.err = pe[0];
      child_out = close_after[0] = po[1];
      child_err = close_after[1] = pe[1];
    }
    std::fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) ExecRank(self, path, argv.data(), envp.data(), child_out, child_err);
    for (int fd : close_after) {
      if (fd >= 0) close(fd);
    }
    if (pid < 0) {
      setup_error = absl::InternalError(absl::StrCat("launcher: fork: ", std::strerror(errno)));
      break;
    }
    c.pid = pid;
    c.running = true;
    rep.ranks[r].pid = pid;
  }

  // Supervise: forward output, reap, stop everyone on the first failure or a signal.
  bool stopping = false;
  bool killed = false;
  auto grace_deadline = Clock::now();
  auto stop_all = [&](int sig) {
    for (Child& c : children) {
      if (c.running) {
        kill(c.pid, sig);
        rep.ranks[c.rank].stopped_by_launcher = true;
      }
    }
  };
  auto begin_stop = [&](int sig) {
    if (stopping) return;
    stopping = true;
    grace_deadline = Clock::now() + std::chrono::milliseconds(
                                        static_cast<int64_t>(options.grace_period_s * 1000.0));
    stop_all(sig);
  };
  if (!setup_error.ok()) begin_stop(SIGTERM);  // ranks already started must not linger
  while (true) {
    bool any_running = false;
    for (const Child& c : children) any_running |= c.running;
    bool any_pipe = false;
    for (const Child& c : children) any_pipe |= c.out >= 0 || c.err >= 0;
    if (!any_running && !any_pipe) break;

    std::vector<pollfd> fds;
    if (wake_read >= 0) fds.push_back({wake_read, POLLIN, 0});
    for (const Child& c : children) {
      if (c.out >= 0) fds.push_back({c.out, POLLIN, 0});
      if (c.err >= 0) fds.push_back({c.err, POLLIN, 0});
    }
    // Once every rank is reaped, only drain what is already buffered: a grandchild that kept a
    // pipe open must not hold the launcher.
    int timeout_ms = any_running ? (options.forward_signals ? 100 : 20) : 0;
    int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready > 0) {
      for (const pollfd& p : fds) {
        if (p.revents == 0) continue;
        if (p.fd == wake_read) {
          char buf[64];
          while (read(wake_read, buf, sizeof(buf)) > 0) {
          }
          continue;
        }
        for (Child& c : children) {
          const std::string prefix = absl::StrCat("[rank ", c.rank, "] ");
          if (p.fd == c.out) Pump(&c.out, &c.out_line, options.out_fd, prefix);
          if (p.fd == c.err) Pump(&c.err, &c.err_line, options.err_fd, prefix);
        }
      }
    } else if (!any_running) {
      for (Child& c : children) {
        for (int* fd : {&c.out, &c.err}) {
          if (*fd >= 0) {
            close(*fd);
            *fd = -1;
          }
        }
      }
    }

    for (Child& c : children) {
      if (!c.running) continue;
      int status = 0;
      pid_t got = waitpid(c.pid, &status, WNOHANG);
      if (got != c.pid) continue;
      c.running = false;
      RankExit& e = rep.ranks[c.rank];
      e.exited = WIFEXITED(status);
      e.exit_code = e.exited ? WEXITSTATUS(status) : 0;
      e.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      const bool failed = !e.exited || e.exit_code != 0;
      if (failed && rep.first_failure < 0 && !e.stopped_by_launcher && rep.forwarded_signal == 0) {
        rep.first_failure = c.rank;
        begin_stop(SIGTERM);
      }
    }

    if (g_signal != 0 && options.forward_signals) {
      const int sig = g_signal;
      g_signal = 0;
      if (rep.forwarded_signal == 0 && !stopping) {
        rep.forwarded_signal = sig;
        begin_stop(sig);
      } else {
        stop_all(SIGKILL);  // a second signal, or one during shutdown: no more waiting
        killed = true;
      }
    }
    if (stopping && !killed && Clock::now() > grace_deadline) {
      stop_all(SIGKILL);
      killed = true;
    }
  }

  if (!setup_error.ok()) return setup_error;
  if (rep.first_failure >= 0) {
    // Ranks that failed on their own after the first usually did so because of it; list them.
    std::vector<std::string> also;
    for (const RankExit& e : rep.ranks) {
      bool failed = !e.exited || e.exit_code != 0;
      if (failed && e.rank != rep.first_failure && !e.stopped_by_launcher) {
        also.push_back(e.ToString());
      }
    }
    std::string message = absl::StrCat(rep.ranks[rep.first_failure].ToString(), " (first of ",
                                       options.nproc, " ranks to fail; the others were stopped");
    if (!also.empty()) absl::StrAppend(&message, "; then ", absl::StrJoin(also, ", "));
    return absl::AbortedError(message + ")");
  }
  if (rep.forwarded_signal != 0) {
    return absl::CancelledError(absl::StrCat("launcher received ", SignalName(rep.forwarded_signal),
                                             " and forwarded it to the ranks"));
  }
  return absl::OkStatus();
}

}  // namespace ithaca
