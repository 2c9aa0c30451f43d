#include "server/slurm.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/core/file_util.h"
#include "launch/layout.h"
#include "launch/worker_command.h"

extern char** environ;

namespace ithaca {
namespace {

// 'text' for bash, whatever it holds.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

const std::string& Or(const std::string& a, const std::string& b) { return a.empty() ? b : a; }

}  // namespace

bool SlurmJobState::Active() const {
  static const char* const kActive[] = {"PENDING",   "CONFIGURING",  "RUNNING",    "COMPLETING",
                                        "SUSPENDED", "REQUEUED",     "RESIZING",   "SIGNALING",
                                        "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED"};
  for (const char* s : kActive) {
    if (state == s) return true;
  }
  return false;
}

bool SlurmJobState::Terminal() const { return known && !Active(); }

std::string SlurmJobState::ToString() const {
  if (!known) return "unknown to Slurm (neither squeue nor sacct has it)";
  std::string s = state;
  if (!reason.empty() && reason != "None") absl::StrAppend(&s, " (reason ", reason, ")");
  if (!nodes.empty() && nodes != "None assigned") absl::StrAppend(&s, " on ", nodes);
  return s;
}

std::string SlurmBatchScript(const SlurmSubmission& s, const SlurmDefaults& d) {
  std::string script = "#!/bin/bash\n";
  auto opt = [&](const std::string& flag, const std::string& value) {
    if (!value.empty()) absl::StrAppend(&script, "#SBATCH --", flag, "=", value, "\n");
  };
  // The [slurm] values were checked against their alphabets at admission (engine/spec), so
  // they cannot add options of their own here.
  opt("job-name", "ithaca-" + s.job_id);
  opt("nodes", std::to_string(s.nodes));
  opt("ntasks-per-node", "1");
  if (s.gpus) opt("gpus-per-node", std::to_string(s.ranks_per_node));
  opt("partition", Or(s.partition, d.partition));
  opt("account", Or(s.account, d.account));
  opt("time", Or(s.time_limit, d.time_limit));
  opt("constraint", Or(s.constraint, d.constraint));
  // Slurm's warning before the time limit (and on preemption): the ranks checkpoint and stop
  // (worker/daemon_mode.h), and ithacad queues the job again.
  const int grace = s.signal_grace_s > 0 ? s.signal_grace_s : d.signal_grace_s;
  if (grace > 0) opt("signal", absl::StrCat("USR1@", grace));
  // A failed node is the job's failure (the launcher's, and ithacad's retry policy's), not
  // something Slurm should requeue behind ithacad's back.
  absl::StrAppend(&script, "#SBATCH --no-requeue\n");
  absl::StrAppend(&script, "#SBATCH --output=", SlurmOutputPattern(s.log_dir), "\n");
  // Each node's launcher (LaunchLocal): its line as launch/worker_command.h builds it,
  // in shell words: bash -c's positional arguments and what Slurm sets in every task.
  const std::vector<std::string> launcher =
      WorkerNodeArgs({"\"$0\"", "\"$1\"", "\"$2\"", "\"$3\"", "\"$4\"", "\"$SLURM_NNODES\"",
                      "\"$SLURM_NODEID\"", "\"tcp:$SLURM_LAUNCH_NODE_IPADDR:$5\""});
  absl::StrAppend(
      &script, "# Written by ithacad for job ", s.job_id,
      ": one task per node runs the per-node launcher, whose ranks report to ithacad.\n"
      "# Node 0 (where this script runs, $SLURM_LAUNCH_NODE_IPADDR in every task) serves the\n"
      "# ranks' rendezvous on a port derived from the Slurm job id.\n"
      "port=$((20000 + SLURM_JOB_ID % 20000))\n"
      "exec srun --kill-on-bad-exit=1 --ntasks-per-node=1 bash -c 'exec ",
      absl::StrJoin(launcher, " "), "' \\\n  ", Quote(s.worker_binary), " ",
      Quote(s.daemon_address), " ", Quote(s.job_id), " ", s.ranks_per_node, " ", Quote(s.log_dir),
      " \"$port\"\n");
  return script;
}

absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env, absl::Duration timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("RunCommand: no command");
  // Everything the child needs is built before fork: it may only exec (ithacad has threads).
  std::map<std::string, std::string> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) vars[std::string(*e, eq - *e)] = eq + 1;
  }
  for (const auto& [k, v] : env) vars[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : vars) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (std::string& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError(strerror(errno));
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return absl::InternalError(strerror(errno));
  }
  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // ithacad blocks SIGTERM in its threads
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    execvpe(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  CommandResult result;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) {
      timed_out = true;
      break;
    }
    int n = poll(fds, 2, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      if (got > 0) {
        (i == 0 ? result.out : result.err).append(buf, got);
      } else if (got == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat(argv[0], " did not finish within ", absl::FormatDuration(timeout)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && result.err.empty()) {
    return absl::NotFoundError(absl::StrCat("cannot run ", argv[0], " (not in PATH?)"));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

namespace {

std::string Said(const CommandResult& r) {
  std::string s(absl::StripAsciiWhitespace(r.err.empty() ? r.out : r.err));
  if (s.size() > 500) s = s.substr(0, 500) + "...";
  return s.empty() ? absl::StrCat("exit code ", r.exit_code) : s;
}

}  // namespace

absl::StatusOr<std::string> SlurmSubmit(const SlurmSubmission& s, const SlurmDefaults& d) {
  const std::string path = SlurmScriptPath(s.log_dir);
  RETURN_IF_ERROR(WriteFileAtomic(path, SlurmBatchScript(s, d)));
  absl::StatusOr<CommandResult> r =
      RunCommand({"sbatch", "--parsable", path}, s.env, d.command_timeout);
  if (!r.ok()) return absl::UnavailableError(absl::StrCat("sbatch: ", r.status().message()));
  if (r->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("sbatch ", path, ": ", Said(*r)));
  }
  // --parsable: "ID" or "ID;cluster".
  std::string id(absl::StripAsciiWhitespace(r->out));
  id = id.substr(0, id.find(';'));
  if (id.empty() ||
      !std::all_of(id.begin(), id.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return absl::UnavailableError(absl::StrCat("sbatch printed no job id: ", Said(*r)));
  }
  return id;
}

absl::Status SlurmCancel(const std::string& slurm_id, int signal, const SlurmDefaults& d) {
  std::vector<std::string> argv = {"scancel"};
  if (signal != 0) argv.push_back(absl::StrCat("--signal=", signal));
  argv.push_back(slurm_id);
  absl::StatusOr<CommandResult> r = RunCommand(argv, {}, d.command_timeout);
  if (!r.ok()) return absl::UnavailableError(absl::StrCat("scancel: ", r.status().message()));
  if (r->exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("scancel ", slurm_id, ": ", Said(*r)));
  }
  return absl::OkStatus();
}

void CountSlurmNodeState(const std::string& state, SlurmClusterState* s) {
  ++s->nodes;
  // A trailing "*" is a node that does not respond; "~" (powered off), "#", "!", "%", "$", "@"
  // and "-" (planned) qualify a state the node still has.
  if (absl::EndsWith(state, "*")) {
    ++s->unavailable;
    return;
  }
  std::string base = state;
  while (!base.empty() && !absl::ascii_isalpha(static_cast<unsigned char>(base.back()))) {
    base.pop_back();
  }
  if (base == "idle") {
    ++s->idle;
  } else if (base == "allocated" || base == "mixed" || base == "completing") {
    ++s->busy;
  } else {
    ++s->unavailable;
  }
}

absl::StatusOr<SlurmClusterState> QuerySlurmCluster(const SlurmDefaults& d) {
  std::vector<std::string> argv = {"sinfo", "-h", "-N", "-o", "%N|%T"};
  if (!d.partition.empty()) argv.insert(argv.end(), {"-p", d.partition});
  absl::StatusOr<CommandResult> r = RunCommand(argv, {}, d.command_timeout);
  if (!r.ok()) return absl::UnavailableError(absl::StrCat("sinfo: ", r.status().message()));
  if (r->exit_code != 0) return absl::UnavailableError(absl::StrCat("sinfo: ", Said(*r)));
  SlurmClusterState s;
  std::set<std::string> seen;  // -N prints a node once per partition it is in
  for (absl::string_view line : absl::StrSplit(r->out, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> f = absl::StrSplit(absl::StripAsciiWhitespace(line), '|');
    if (f.size() != 2 || !seen.insert(f[0]).second) continue;
    CountSlurmNodeState(f[1], &s);
  }
  return s;
}

absl::StatusOr<SlurmJobState> SlurmQuery(const std::string& slurm_id, const SlurmDefaults& d) {
  SlurmJobState st;
  absl::StatusOr<CommandResult> q = RunCommand(
      {"squeue", "-h", "--states=all", "-j", slurm_id, "-o", "%T|%r|%N"}, {}, d.command_timeout);
  if (!q.ok()) return absl::UnavailableError(absl::StrCat("squeue: ", q.status().message()));
  std::string line(absl::StripAsciiWhitespace(q->out));
  line = line.substr(0, line.find('\n'));
  if (q->exit_code == 0 && !line.empty()) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits('|', 2));
    st.known = true;
    st.state = f[0];
    if (f.size() > 1) st.reason = f[1];
    if (f.size() > 2) st.nodes = f[2];
    return st;
  }
  const bool forgotten = absl::StrContains(q->err, "Invalid job id") || (q->exit_code == 0);
  if (!forgotten) return absl::UnavailableError(absl::StrCat("squeue: ", Said(*q)));
  // squeue forgets a job MinJobAge after its end; the accounting database, where there is one,
  // remembers it.
  absl::StatusOr<CommandResult> a =
      RunCommand({"sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State,Reason,NodeList"}, {},
                 d.command_timeout);
  if (a.ok() && a->exit_code == 0) {
    std::string row(absl::StripAsciiWhitespace(a->out));
    row = row.substr(0, row.find('\n'));
    if (!row.empty()) {
      std::vector<std::string> f = absl::StrSplit(row, absl::MaxSplits('|', 2));
      st.known = true;
      st.state = f[0].substr(0, f[0].find(' '));  // "CANCELLED by 0"
      if (f[0].size() > st.state.size()) st.reason = f[0];
      if (f.size() > 1 && st.reason.empty()) st.reason = f[1];
      if (f.size() > 2) st.nodes = f[2];
    }
  }
  return st;
}

int64_t SlurmDurationSeconds(const std::string& text) {
  // [D-]HH:MM:SS, [D-]MM:SS, MM (as squeue prints TimeUsed and TimeLimit).
  std::string t(absl::StripAsciiWhitespace(text));
  int64_t days = 0;
  if (size_t dash = t.find('-'); dash != std::string::npos) {
    if (!absl::SimpleAtoi(t.substr(0, dash), &days)) return -1;
    t = t.substr(dash + 1);
  }
  int64_t total = 0;
  for (absl::string_view part : absl::StrSplit(t, ':')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 0) return -1;
    total = total * 60 + v;
  }
  return days * 86400 + total;
}

absl::StatusOr<std::string> SlurmWarningCause(const std::string& slurm_id, int grace_s,
                                              const SlurmDefaults& d) {
  absl::StatusOr<CommandResult> q = RunCommand(
      {"squeue", "-h", "--states=all", "-j", slurm_id, "-O", "PreemptTime,TimeUsed,TimeLimit"}, {},
      d.command_timeout);
  if (!q.ok()) return absl::UnavailableError(absl::StrCat("squeue: ", q.status().message()));
  std::vector<std::string> f =
      absl::StrSplit(absl::StripAsciiWhitespace(q->out), ' ', absl::SkipEmpty());
  if (q->exit_code != 0 || f.size() < 3) {
    return absl::UnavailableError(absl::StrCat("squeue does not remember Slurm job ", slurm_id));
  }
  if (f[0] != "N/A" && f[0] != "None" && f[0] != "Unknown") {
    return absl::StrCat("PREEMPTED at ", f[0]);
  }
  const int64_t used = SlurmDurationSeconds(f[1]), limit = SlurmDurationSeconds(f[2]);
  // Slurm checks time limits (and sends the warning) about every 30 s.
  if (used >= 0 && limit > 0 && limit - used <= grace_s + 60) {
    return absl::StrCat("TIMEOUT (used ", f[1], " of its ", f[2], ")");
  }
  return absl::StrCat("SIGUSR1 from outside Slurm's schedule (a user's scancel --signal=USR1; ",
                      "used ", f[1], " of ", f[2], ", not preempted)");
}

std::string SlurmOutputErrors(const std::string& log_dir, const std::string& slurm_id,
                              int max_lines) {
  std::ifstream in(SlurmOutputPath(log_dir, slurm_id));
  std::vector<std::string> found;
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StrContains(line, "srun: error:") || absl::StrContains(line, "***") ||
        absl::StrContains(line, "slurmstepd") || absl::StrContains(line, "ithaca-worker:")) {
      found.push_back(std::string(absl::StripAsciiWhitespace(line)));
    }
  }
  // A node that failed is named first ("Task launch for StepId=4.0 failed on node n2"), then the
  // newest lines.
  std::vector<std::string> picked;
  for (const std::string& l : found) {
    if (absl::StrContains(l, "on node") && static_cast<int>(picked.size()) < max_lines) {
      picked.push_back(l);
    }
  }
  for (auto it = found.rbegin(); it != found.rend() && static_cast<int>(picked.size()) < max_lines;
       ++it) {
    if (std::find(picked.begin(), picked.end(), *it) == picked.end()) {
      picked.insert(picked.begin() + (picked.empty() ? 0 : 1), *it);
    }
  }
  return absl::StrJoin(picked, "; ");
}

}  // namespace ithaca
