// Launcher: starts a job's ranks, one process each, and tells how they ended. ithacad starts
// `ithaca-worker --daemon` ranks with it (and supervises them itself); the worker's own launcher
// (`ithaca-worker --standalone job.toml --nproc N`, and each node of a Slurm job) starts its
// ranks with it too and supervises them with LaunchLocal (worker/local_launch.h).
//
// Every rank runs in the launch's own process group, so one killpg reaches them all (and what
// they start); gets ITHACA_RANK / ITHACA_WORLD_SIZE / ITHACA_RENDEZVOUS / ITHACA_GPU (and
// OMP_NUM_THREADS, its share of the cores, unless set); reads /dev/null; and, unless the launch
// says otherwise (LaunchSpec::die_with_launcher), dies with SIGKILL when the thread that started
// it exits (PR_SET_PDEATHSIG: call from a thread that lives as long as the ranks).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "launch/exit_codes.h"
#include "launch/layout.h"

namespace ithaca {

// Where one rank's stdout and stderr go.
struct RankOutput {
  std::string log_path;  // set: both are appended to this file
  int out_fd = 1;        // else these descriptors (the launcher's own by default)
  int err_fd = 2;
};

// An unprivileged user the ranks run as (a daemon started as root must not run jobs as root).
struct RunAs {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, from the group database
  std::string home;
};

// The user `name` (or a numeric uid) from the password database. NOT_FOUND naming it;
// INVALID_ARGUMENT for root (uid 0), which would drop nothing.
absl::StatusOr<RunAs> LookUpRunAs(const std::string& name);

struct LaunchSpec {
  // The command each rank runs: argv[0] is a path, or a name looked up in PATH.
  std::vector<std::string> argv;
  // gpus[r] is rank r's ITHACA_GPU (a GPU index, or a CPU slot); its size is the world size.
  std::vector<int> gpus;
  std::string rendezvous;  // ITHACA_RENDEZVOUS: "file:/dir", which the caller created, or "tcp:"
  // Ranks spanning several launches (nodes): ITHACA_RANK = first_rank + r, ITHACA_WORLD_SIZE =
  // world. world 0: gpus.size() (one launch holds every rank).
  int first_rank = 0;
  int world = 0;
  // Added to (or replacing keys of) the launcher's environment for every rank.
  std::vector<std::pair<std::string, std::string>> env;
  // One per rank; empty: every rank writes to the launcher's stdout and stderr.
  std::vector<RankOutput> outputs;
  // Set: each rank sets its groups, gid and uid to these before exec (the launcher must be
  // root), and gets HOME / USER / LOGNAME of that user.
  std::optional<RunAs> run_as;
  // true: the ranks get PR_SET_PDEATHSIG and die when the launching thread does. false
  // (ithacad's supervisor): they outlive the launcher, in their own process group, so a daemon
  // restart does not cost the job; the next daemon adopts them (server/adoption.h).
  bool die_with_launcher = true;
  // true: the ranks start with SIGUSR1 blocked, so a drain (Slurm's warning, ithacad's drain)
  // that reaches a rank before it installs its handler waits, pending, instead of killing it.
  // For daemon ranks only, which unblock it once they take it (worker/daemon_mode.h).
  bool drain_signal_blocked = false;
};

struct WorkerGroup {
  pid_t pgid = 0;
  std::vector<pid_t> pids;  // pids[rank]
};

// How a rank's process ended.
class Launcher {
 public:
  // Forks and execs every rank. FAILED_PRECONDITION when argv[0] is not an executable file,
  // NOT_FOUND when no such command is in PATH, INVALID_ARGUMENT for an empty spec, INTERNAL when
  // a log file or a process cannot be made (the ranks already started are then killed).
  static absl::StatusOr<WorkerGroup> Launch(const LaunchSpec& spec);
  // The exit of `pid` if it has ended (reaps it), nullopt while it runs.
  static std::optional<WorkerEnd> Poll(pid_t pid);
  // killpg; true when the group still had members.
  static bool SignalGroup(pid_t pgid, int sig);
  static bool GroupAlive(pid_t pgid);
};

}  // namespace ithaca
