// Daemon mode: `ithaca-worker --daemon SOCKET --job ID` is one rank of a job that ithacad
// launched. It registers on the daemon's WorkerService (unix socket), receives the spec, joins
// the collective group, trains, reports every step and heart-beats (daemon_client.h), and
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
#include "worker/daemon_client.h"

namespace ithaca {

// Fills what the flags left empty from the environment the launcher sets.
absl::StatusOr<DaemonWorkerOptions> DaemonWorkerOptionsFromEnv(const std::string& socket_flag,
                                                               const std::string& job_flag);

// Runs the rank to its end; returns the process exit code.
int RunDaemonWorker(const DaemonWorkerOptions& options);

}  // namespace ithaca
