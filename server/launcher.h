// Launcher: starts one job's ithaca-worker processes (one per rank) in a process group of their
// own, so one killpg reaches them all; each child dies with the daemon (PR_SET_PDEATHSIG), so no
// worker can outlive it. Also turns exit statuses into reasons.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

struct WorkerLaunch {
  std::string job_id;
  std::string worker_binary;
  std::string daemon_socket;           // the WorkerService unix socket
  std::string rendezvous;              // "file:/dir"
  std::string log_dir;                 // rank-R.log files go here
  std::vector<int> slots;              // slots[rank]: GPU index (or CPU slot)
  bool gpu = false;                    // slots are GPUs
  int threads_per_rank = 0;            // OMP_NUM_THREADS when > 0 (CPU ranks share the cores)
  std::vector<std::string> extra_env;  // "KEY=VALUE", after the inherited environment
};

struct WorkerGroup {
  int pgid = 0;
  std::vector<int> pids;  // pids[rank]
};

// How a worker ended.
struct WorkerEnd {
  bool signaled = false;
  int code = 0;  // exit code, or the signal number when signaled
  // Metric label: "ok", "error", "bad_spec", "oom", "nan_loss", "killed", "signal".
  std::string Reason() const;
  // "exited with code 4 (NaN loss)", "killed by signal 9 (Killed)".
  std::string Describe() const;
};

class Launcher {
 public:
  // Forks and execs every rank. Call it from a thread that lives as long as the daemon: the
  // children's death signal fires when the thread that forked them exits.
  static absl::StatusOr<WorkerGroup> Launch(const WorkerLaunch& launch);
  // The exit of `pid` if it has ended (reaps it), nullopt while it runs.
  static std::optional<WorkerEnd> Poll(int pid);
  // killpg; true when the group still had members.
  static bool SignalGroup(int pgid, int sig);
  static bool GroupAlive(int pgid);
  static std::string RankLogPath(const std::string& log_dir, int rank);
};

}  // namespace ithaca
