#include "launch/launcher.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/comm/rank_env.h"
#include "engine/core/file_util.h"
#include "launch/exit_codes.h"

extern char** environ;

namespace ithaca {
namespace {

void WriteNumber(int fd, int value) {
  char digits[16];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0 && n < 16);
  char out[16];
  for (int i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  WriteAllToFd(fd, out, static_cast<size_t>(n));
}

// execve needs a path; resolving it here keeps the child between fork and exec to
// async-signal-safe calls, and a command that cannot run is an error before any rank starts.
absl::StatusOr<std::string> ResolveCommand(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("launcher: ", name, ": ", std::strerror(errno)));
    }
    return name;
  }
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "/usr/bin:/bin", ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("launcher: ", name, ": command not found in PATH"));
}

// The environment every rank shares: the launcher's, `extra` replacing or adding keys, and
// OMP_NUM_THREADS (ranks on one machine share its cores: one OpenMP pool per core, not per rank)
// unless either sets it.
std::map<std::string, std::string> BaseEnvironment(
    const std::vector<std::pair<std::string, std::string>>& extra, int world) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env[std::string(*e, eq - *e)] = eq + 1;
  }
  for (const auto& [key, value] : extra) env[key] = value;
  if (env.count("OMP_NUM_THREADS") == 0) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    env["OMP_NUM_THREADS"] = std::to_string(std::max(1L, cores / std::max(1, world)));
  }
  return env;
}

[[noreturn]] void ExitWithError(const char* what, int err) {
  WriteAllToFd(STDERR_FILENO, "launcher: ", 10);
  WriteAllToFd(STDERR_FILENO, what, std::strlen(what));
  WriteAllToFd(STDERR_FILENO, " failed: errno ", 15);
  WriteNumber(STDERR_FILENO, err);
  WriteAllToFd(STDERR_FILENO, "\n", 1);
  _exit(127);
}

// In the child: only async-signal-safe calls until exec.
[[noreturn]] void ExecRank(pid_t parent, pid_t pgid, const char* path, char* const* argv,
                           char* const* envp, int in_fd, int out_fd, int err_fd,
                           const RunAs* run_as, bool die_with_launcher, bool block_drain) {
  setpgid(0, pgid);  // rank 0 founds the group (pgid 0: its own pid)
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) sigaction(sig, &dfl, nullptr);
  sigset_t mask;
  sigemptyset(&mask);
  if (block_drain) sigaddset(&mask, SIGUSR1);  // kept across exec, until the rank takes it
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  if (dup2(in_fd, STDIN_FILENO) < 0) _exit(127);
  if (out_fd != STDOUT_FILENO && dup2(out_fd, STDOUT_FILENO) < 0) _exit(127);
  if (err_fd != STDERR_FILENO && dup2(err_fd, STDERR_FILENO) < 0) _exit(127);
  if (run_as != nullptr) {
    // Groups first: after setuid the process may no longer change them.
    if (setgroups(run_as->groups.size(), run_as->groups.data()) != 0) {
      ExitWithError("setgroups", errno);
    }
    if (setgid(run_as->gid) != 0) ExitWithError("setgid", errno);
    if (setuid(run_as->uid) != 0) ExitWithError("setuid", errno);
    if (setuid(0) == 0) ExitWithError("dropping root (setuid(0) still works)", 0);
  }
  if (die_with_launcher) {
    // After the credentials change, which clears the parent-death signal.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl took effect
  }
  close_range(3, ~0U, 0);  // nothing of the launcher's leaks into a rank
  execve(path, argv, envp);
  int err = errno;
  static const char kMsg[] = "launcher: exec failed for ";
  WriteAllToFd(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
  WriteAllToFd(STDERR_FILENO, path, std::strlen(path));
  WriteAllToFd(STDERR_FILENO, ": errno ", 8);
  WriteNumber(STDERR_FILENO, err);
  WriteAllToFd(STDERR_FILENO, "\n", 1);
  _exit(127);
}

// Kills and reaps the ranks a failed launch had already started.
void KillStarted(const WorkerGroup& group) {
  if (group.pgid > 0) killpg(group.pgid, SIGKILL);
  for (pid_t pid : group.pids) waitpid(pid, nullptr, 0);
}

}  // namespace

absl::StatusOr<RunAs> LookUpRunAs(const std::string& name) {
  std::vector<char> buf(1 << 16);
  struct passwd pw, *found = nullptr;
  int rc = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found);
  uid_t numeric = 0;
  if (found == nullptr && absl::SimpleAtoi(name, &numeric)) {
    rc = getpwuid_r(numeric, &pw, buf.data(), buf.size(), &found);
  }
  if (found == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("no user \"", name, "\" in the password database",
                     rc != 0 ? absl::StrCat(" (", std::strerror(rc), ")") : std::string()));
  }
  if (pw.pw_uid == 0) {
    return absl::InvalidArgumentError(absl::StrCat("user \"", name, "\" is root (uid 0)"));
  }
  RunAs r;
  r.name = pw.pw_name;
  r.uid = pw.pw_uid;
  r.gid = pw.pw_gid;
  r.home = pw.pw_dir;
  int n = 64;
  r.groups.resize(n);
  if (getgrouplist(pw.pw_name, pw.pw_gid, r.groups.data(), &n) < 0) {
    r.groups.resize(n);
    getgrouplist(pw.pw_name, pw.pw_gid, r.groups.data(), &n);
  }
  r.groups.resize(std::max(n, 0));
  return r;
}

absl::StatusOr<WorkerGroup> Launcher::Launch(const LaunchSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("launcher: no command");
  const int world = static_cast<int>(spec.gpus.size());
  if (world == 0) return absl::InvalidArgumentError("launcher: no ranks");
  const int total_world = spec.world > 0 ? spec.world : world;
  if (spec.first_rank < 0 || spec.first_rank + world > total_world) {
    return absl::InvalidArgumentError(absl::StrCat("launcher: ranks ", spec.first_rank, "..",
                                                   spec.first_rank + world - 1,
                                                   " are not ranks of a world of ", total_world));
  }
  if (!spec.outputs.empty() && static_cast<int>(spec.outputs.size()) != world) {
    return absl::InvalidArgumentError(
        absl::StrCat("launcher: ", spec.outputs.size(), " outputs listed for ", world, " ranks"));
  }
  ASSIGN_OR_RETURN(std::string path, ResolveCommand(spec.argv[0]));
  const std::map<std::string, std::string> base = BaseEnvironment(spec.env, world);
  std::vector<std::string> args = spec.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    return absl::InternalError(absl::StrCat("launcher: /dev/null: ", std::strerror(errno)));
  }

  WorkerGroup group;
  const pid_t parent = getpid();
  for (int rank = 0; rank < world; ++rank) {
    // Everything the child needs is built before fork: after it, only async-signal-safe calls.
    std::map<std::string, std::string> vars = base;
    vars[kEnvRank] = std::to_string(spec.first_rank + rank);
    vars[kEnvWorldSize] = std::to_string(total_world);
    vars[kEnvLocalWorldSize] = std::to_string(world);  // this node's ranks
    vars[kEnvRendezvous] = spec.rendezvous;
    vars[kEnvGpu] = std::to_string(spec.gpus[rank]);
    if (spec.run_as) {
      vars["HOME"] = spec.run_as->home;
      vars["USER"] = vars["LOGNAME"] = spec.run_as->name;
    }
    std::vector<std::string> env;
    for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
    std::vector<char*> envp;
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    const RankOutput output = spec.outputs.empty() ? RankOutput() : spec.outputs[rank];
    int out_fd = output.out_fd, err_fd = output.err_fd, log_fd = -1;
    if (!output.log_path.empty()) {
      // Its user's alone: a rank's output is a job's (ithacad's rank logs, issue 53 N11).
      log_fd = open(output.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (log_fd < 0) {
        const int err = errno;
        close(null_fd);
        KillStarted(group);
        return absl::InternalError(
            absl::StrCat("launcher: ", output.log_path, ": ", std::strerror(err)));
      }
      out_fd = err_fd = log_fd;
    }
    std::fflush(nullptr);
    const pid_t pgid = group.pgid;
    const pid_t pid = fork();
    if (pid == 0) {
      ExecRank(parent, pgid, path.c_str(), argv.data(), envp.data(), null_fd, out_fd, err_fd,
               spec.run_as ? &*spec.run_as : nullptr, spec.die_with_launcher,
               spec.drain_signal_blocked);
    }
    const int fork_errno = errno;
    if (log_fd >= 0) close(log_fd);
    if (pid < 0) {
      close(null_fd);
      KillStarted(group);
      return absl::InternalError(absl::StrCat("launcher: fork: ", std::strerror(fork_errno)));
    }
    if (group.pgid == 0) group.pgid = pid;
    setpgid(pid, group.pgid);  // also here, so the group exists whichever runs first
    group.pids.push_back(pid);
  }
  close(null_fd);
  return group;
}

std::optional<WorkerEnd> Launcher::Poll(pid_t pid) {
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

bool Launcher::SignalGroup(pid_t pgid, int sig) { return pgid > 0 && killpg(pgid, sig) == 0; }

bool Launcher::GroupAlive(pid_t pgid) { return pgid > 0 && killpg(pgid, 0) == 0; }

}  // namespace ithaca
