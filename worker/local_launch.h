// LaunchLocal: a node's ranks started with the launch layer's Launcher::Launch and supervised
// until all have ended, like torchrun: `ithaca-worker --standalone job.toml --nproc N`, and
// `ithaca-worker --daemon ADDR --job ID --nproc N` on each node of a Slurm job. With --nnodes M
// --node-rank R --rendezvous tcp:HOST:PORT, one such launcher per machine runs one job across M
// machines (worker/node_link.h). ithacad supervises its ranks itself (server/supervisor.h).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "launch/exit_codes.h"
#include "launch/launcher.h"

namespace ithaca {

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
