// Daemon mode: `ithaca-worker --daemon SOCKET --job ID` is one rank of a job that ithacad
// launched. It registers on the daemon's WorkerService (unix socket), receives the spec, joins
// the collective group, trains, reports every step, heart-beats from a thread of its own, and
// exits with a code from exit_codes.h (SIGTERM: kExitKilled after the current step).
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

struct DaemonWorkerOptions {
  std::string socket;  // --daemon, else $ITHACA_DAEMON_SOCKET
  std::string job_id;  // --job, else $ITHACA_JOB_ID
  int rank = 0;        // $ITHACA_RANK
  int world = 1;       // $ITHACA_WORLD_SIZE
};

// Fills what the flags left empty from the environment the launcher sets.
absl::StatusOr<DaemonWorkerOptions> DaemonWorkerOptionsFromEnv(const std::string& socket_flag,
                                                               const std::string& job_flag);

// Runs the rank to its end; returns the process exit code.
int RunDaemonWorker(const DaemonWorkerOptions& options);

}  // namespace ithaca
