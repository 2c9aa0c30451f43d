// Daemon mode: `ithaca-worker --daemon SOCKET --job ID` is one rank of a job that ithacad
// launched. It registers on the daemon's WorkerService (unix socket), receives the spec, joins
// the collective group, trains, reports every step, heart-beats from a thread of its own, and
// exits with a code from exit_codes.h (SIGTERM: kExitKilled after the current step; SIGUSR1, a
// drain: a checkpoint, then kExitDrained; the ranks agree on the step, so they stop together).
//
// A rank outlives its daemon: when ithacad stops or dies, the rank trains on, keeps its step
// reports queued, and re-attaches to the daemon that comes back on the same socket (Register
// with reattach and the job's secret), which then receives every report in order. It gives up
// (exits) when no daemon answers for the timeout the daemon gave at Register, or when the new
// daemon does not know the job.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

struct DaemonWorkerOptions {
  std::string socket;  // --daemon, else $ITHACA_DAEMON_SOCKET
  std::string job_id;  // --job, else $ITHACA_JOB_ID
  int rank = 0;        // $ITHACA_RANK
  int world = 1;       // $ITHACA_WORLD_SIZE
  std::string secret;  // $ITHACA_JOB_SECRET: proves the rank is the job's at (re-)registration
  // $ITHACA_DAEMON_ADDR_FILE (a Slurm job's <job dir>/daemon.addr, on shared storage): where the
  // daemon is now. A rank whose daemon went away reads it before each re-attach, so a daemon
  // restarted on another host or port is found.
  std::string address_file;
};

// Fills what the flags left empty from the environment the launcher sets.
absl::StatusOr<DaemonWorkerOptions> DaemonWorkerOptionsFromEnv(const std::string& socket_flag,
                                                               const std::string& job_flag);

// Runs the rank to its end; returns the process exit code.
int RunDaemonWorker(const DaemonWorkerOptions& options);

// For a node's launcher (ithaca-worker --daemon ADDR --job ID --nproc N): tells the daemon at
// `address` that `rank` of `job_id` was killed by `signal`, with the job's secret from
// $ITHACA_JOB_SECRET. A killed rank cannot say so itself, and without this the daemon, seeing
// the Slurm job end, could not tell the killed rank from the ones its launchers then stopped.
// Best effort: waits at most 5 s, and a daemon that is away misses it.
void ReportKilledRank(const std::string& address, const std::string& job_id, int rank, int signal);

}  // namespace ithaca
