// Launcher: starts a job's ranks, one process each, and tells how they ended. ithacad starts
// `ithaca-worker --daemon` ranks with it (and supervises them itself); `ithaca-worker
// --standalone job.toml --nproc N` starts `--standalone` ranks and supervises them with
// LaunchLocal below (like torchrun); with --nnodes M --node-rank R --rendezvous tcp:HOST:PORT,
// one such launcher per machine runs one job across M machines.
//
// Every rank runs in the launch's own process group, so one killpg reaches them all (and what
// they start); gets ITHACA_RANK / ITHACA_WORLD_SIZE / ITHACA_RENDEZVOUS / ITHACA_GPU (and
// OMP_NUM_THREADS, its share of the cores, unless set); reads /dev/null; and, unless the launch
// says otherwise (LaunchSpec::die_with_launcher), dies with SIGKILL when the thread that started
// it exits (PR_SET_PDEATHSIG: call from a thread that lives as long as the ranks).
#pragma once

#include <sys/types.h>

#include <functional>
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

// ---- Supervised local launch (`ithaca-worker --standalone job.toml --nproc N`).

struct LaunchOptions {
  std::vector<std::string> argv;
  int nproc = 1;
  // Rank r gets ITHACA_GPU = gpus[r]; empty: ITHACA_GPU = r.
  std::vector<int> gpus;
  // Extra environment for every rank (on top of the launcher's own).
  std::vector<std::pair<std::string, std::string>> env;
  // Rank 0 writes to out_fd / err_fd directly. Other ranks' lines go there too, prefixed
  // "[rank r] ", unless log_dir is set: then to RankLogPath(log_dir, r) (launch/layout.h).
  int out_fd = 1;
  int err_fd = 2;
  std::string log_dir;
  // After a failure or a forwarded signal, how long ranks get to exit before SIGKILL.
  double grace_period_s = 10;
  // Parent of the rendezvous directory the launch creates (and removes afterwards);
  // empty: $TMPDIR, else /tmp.
  std::string temp_dir;
  // Several machines, torchrun's shape: one launch per node, each starting `nproc` ranks;
  // global rank = node_rank * nproc + local rank, world = nnodes * nproc. `rendezvous`
  // ("tcp:HOST:PORT", required when nnodes > 1, optional otherwise) is a TcpStore that node 0's
  // launch serves on PORT (HOST must reach node 0) and every launch and rank connects to. A node
  // whose ranks fail, or whose launcher vanishes, stops every node's ranks, and every launcher's
  // error names it. Without it, a file rendezvous in temp_dir (one machine).
  int nnodes = 1;
  int node_rank = 0;
  std::string rendezvous;
  // How long launchers wait for every node to join (and node 0 for every node to finish).
  double rendezvous_timeout_s = 300;
  // Install handlers for the launch (restored afterwards): SIGINT / SIGTERM are forwarded to
  // the ranks, and SIGCHLD wakes the launcher so that the rank failing first is reaped first.
  // Only one launch per process may do this at a time. Without them, exits are polled.
  bool forward_signals = true;
  // With forward_signals: SIGUSR1 is forwarded to the ranks too, as a drain (Slurm's warning
  // signal before a time limit or a preemption, `#SBATCH --signal`; `ithaca drain`): they agree
  // on a step, checkpoint together and exit with kExitDrained, which is then no failure. Only for
  // ranks that take SIGUSR1 so (daemon ranks, worker/daemon_mode.h); it would kill others.
  bool forward_drain = false;
  // Called (on the launcher's thread) as soon as a rank is found killed by a signal the launcher
  // did not send, before the other ranks are stopped: a daemon's Slurm ranks tell ithacad which
  // rank was killed, which that rank cannot (worker/daemon_mode.h ReportKilledRank).
  std::function<void(int global_rank, const WorkerEnd& end)> on_rank_killed;
};

struct RankExit {
  int rank = 0;  // the global rank
  pid_t pid = 0;
  WorkerEnd end;
  bool stopped_by_launcher = false;  // it was sent SIGTERM/SIGKILL because of another's failure
  std::string ToString()
      const;  // "rank 2 exited with code 3 (...)", "rank 1 killed by SIGKILL (signal 9)"
};

struct LaunchReport {
  std::vector<RankExit> ranks;  // this node's ranks, by local rank
  int first_failure = -1;       // the local rank that failed first; -1 if none did
  int forwarded_signal = 0;     // SIGINT / SIGTERM the launcher received, 0 if none
  bool drained = false;         // a rank checkpointed and stopped on a drain (forward_drain)
  // Another node failed (or vanished) first: what the rendezvous says about it, naming it.
  std::string remote_failure;
  // The exit code a launcher process should end with: the first failing rank's (128 + signal
  // if it was killed), 128 + the forwarded signal, 1 for another node's failure, or 0.
  int ExitCode() const;
};

// Runs the ranks and supervises them until all have ended: the first rank to fail stops the
// others (SIGTERM, then SIGKILL after the grace period), and SIGINT / SIGTERM sent to the
// launcher are forwarded. OK when every rank exits 0 (on every node). Otherwise: ABORTED naming
// the first failing rank and its exit code or signal (and, across nodes, its node; or the node
// that failed or vanished first), CANCELLED when a forwarded signal stopped the run, and
// Launcher::Launch's errors. `report` (optional) receives every rank's exit.
absl::Status LaunchLocal(const LaunchOptions& options, LaunchReport* report = nullptr);

}  // namespace ithaca
