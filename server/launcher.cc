#include "server/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>

#include "absl/strings/match.h"
#include "worker/exit_codes.h"

extern char** environ;

namespace ithaca {
namespace {

// Environment = the daemon's, with `overrides` replacing or adding keys.
std::vector<std::string> BuildEnv(const std::vector<std::string>& overrides) {
  std::map<std::string, std::string> env;
  auto put = [&env](const std::string& kv) {
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv;
  };
  for (char** e = environ; e && *e; ++e) put(*e);
  for (const std::string& kv : overrides) put(kv);
  std::vector<std::string> out;
  for (auto& [k, kv] : env) out.push_back(kv);
  return out;
}

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::string Launcher::RankLogPath(const std::string& log_dir, int rank) {
  return absl::StrCat(log_dir, "/rank-", rank, ".log");
}

absl::StatusOr<WorkerGroup> Launcher::Launch(const WorkerLaunch& l) {
  if (access(l.worker_binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker binary ", l.worker_binary, ": ", strerror(errno)));
  }
  WorkerGroup group;
  const int world = static_cast<int>(l.slots.size());
  const pid_t parent = getpid();
  for (int rank = 0; rank < world; ++rank) {
    // Everything the child needs is built before fork: after it, only async-signal-safe calls.
    std::vector<std::string> args = {l.worker_binary, "--daemon", l.daemon_socket, "--job",
                                     l.job_id};
    std::vector<std::string> overrides = {
        absl::StrCat("ITHACA_RANK=", rank),
        absl::StrCat("ITHACA_WORLD_SIZE=", world),
        absl::StrCat("ITHACA_RENDEZVOUS=", l.rendezvous),
        absl::StrCat("ITHACA_GPU=", l.slots[rank]),
        absl::StrCat("ITHACA_DAEMON_SOCKET=", l.daemon_socket),
        absl::StrCat("ITHACA_JOB_ID=", l.job_id),
    };
    if (l.threads_per_rank > 0) {
      overrides.push_back(absl::StrCat("OMP_NUM_THREADS=", l.threads_per_rank));
    }
    overrides.insert(overrides.end(), l.extra_env.begin(), l.extra_env.end());
    std::vector<std::string> env = BuildEnv(overrides);
    std::vector<char*> argv = CStrings(args), envp = CStrings(env);
    const std::string log_path = RankLogPath(l.log_dir, rank);
    int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd < 0 || null_fd < 0) {
      const int err = errno;
      if (log_fd >= 0) close(log_fd);
      if (null_fd >= 0) close(null_fd);
      if (group.pgid > 0) killpg(group.pgid, SIGKILL);
      return absl::InternalError(absl::StrCat(log_path, ": ", strerror(err)));
    }
    const pid_t pgid = group.pgid;
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, pgid);  // rank 0 founds the group (pgid 0 → its own pid)
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the daemon died before prctl
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      signal(SIGPIPE, SIG_DFL);
      dup2(null_fd, 0);
      dup2(log_fd, 1);
      dup2(log_fd, 2);
      close_range(3, ~0U, 0);
      execve(argv[0], argv.data(), envp.data());
      const char msg[] = "ithaca-worker: exec failed\n";
      (void)!write(2, msg, sizeof(msg) - 1);
      _exit(127);
    }
    const int fork_errno = errno;
    close(log_fd);
    close(null_fd);
    if (pid < 0) {
      if (group.pgid > 0) killpg(group.pgid, SIGKILL);
      return absl::ResourceExhaustedError(absl::StrCat("fork: ", strerror(fork_errno)));
    }
    if (group.pgid == 0) group.pgid = pid;
    setpgid(pid, group.pgid);  // also here, so the group exists whichever runs first
    group.pids.push_back(pid);
  }
  return group;
}

std::optional<WorkerEnd> Launcher::Poll(int pid) {
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  WorkerEnd e;
  if (r < 0) {  // not our child any more (already reaped): report it as lost
    e.code = kExitError;
    return e;
  }
  if (WIFSIGNALED(status)) {
    e.signaled = true;
    e.code = WTERMSIG(status);
  } else {
    e.code = WEXITSTATUS(status);
  }
  return e;
}

bool Launcher::SignalGroup(int pgid, int sig) { return pgid > 0 && killpg(pgid, sig) == 0; }

bool Launcher::GroupAlive(int pgid) { return pgid > 0 && killpg(pgid, 0) == 0; }

std::string WorkerEnd::Reason() const {
  if (signaled) return "signal";
  switch (code) {
    case kExitOk:
      return "ok";
    case kExitBadSpec:
      return "bad_spec";
    case kExitOutOfMemory:
      return "oom";
    case kExitNanLoss:
      return "nan_loss";
    case kExitKilled:
      return "killed";
    default:
      return "error";
  }
}

std::string WorkerEnd::Describe() const {
  if (signaled) return absl::StrCat("killed by signal ", code, " (", strsignal(code), ")");
  const char* what = "";
  switch (code) {
    case kExitOk:
      what = " (ok)";
      break;
    case kExitBadSpec:
      what = " (bad job spec)";
      break;
    case kExitOutOfMemory:
      what = " (out of memory)";
      break;
    case kExitNanLoss:
      what = " (NaN loss)";
      break;
    case kExitKilled:
      what = " (stopped by SIGTERM)";
      break;
    case 127:
      what = " (could not start)";
      break;
    default:
      what = " (error)";
      break;
  }
  return absl::StrCat("exited with code ", code, what);
}

}  // namespace ithaca
