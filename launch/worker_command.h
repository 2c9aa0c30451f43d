// ithaca-worker's command line, in one place: the lines ithacad and the launchers build for a
// rank (DaemonRankArgs, StandaloneRankArgs, WorkerNodeArgs) and the one parser the worker reads
// them with (ParseWorkerCommand), so what is built and what is accepted cannot drift apart. Every
// flag is refused where its mode does not take it, with the flag named.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

// The worker's modes, named by the flag that selects them (`--standalone JOB.toml`, ...).
enum class WorkerMode { kStandalone, kDaemon, kPlan, kRehearse, kLibraries };

struct WorkerCommand {
  WorkerMode mode = WorkerMode::kStandalone;
  // The mode flag's value: JOB.toml (--standalone, --plan, --rehearse), ADDR (--daemon: the
  // daemon's worker socket, or host:port over TCP; empty: $ITHACA_DAEMON_SOCKET).
  std::string target;
  std::string job_id;  // --job (--daemon); empty: $ITHACA_JOB_ID

  // --standalone or --daemon with a launcher flag: this process launches the node's ranks
  // (LaunchLocal) instead of being one. --daemon needs --nproc for it.
  bool launcher = false;
  int nproc = 1;           // --nproc, 1..4096
  int nnodes = 1;          // --nnodes, 1..4096
  int node_rank = 0;       // --node-rank, 0..4096
  std::string rendezvous;  // --rendezvous tcp:HOST:PORT
  std::string log_dir;     // --log-dir (--daemon launcher only)

  // --rehearse's flags; unset ones keep RehearsalArgs' defaults (worker/standalone.h).
  int rank = -1;                 // --rank, 0..4096
  int nodes = -1;                // --nodes, 1..4096
  std::string link;              // --link
  double device_memory_gib = 0;  // --device-memory-gib, above 0
  double node_host_gib = 0;      // --node-host-gib, above 0
};

// INVALID_ARGUMENT naming the flag: an unknown flag, a flag its mode does not take, a flag
// given twice or without its value, a number out of range, no mode or two of them.
// `args` is the command line without the program's name.
absl::StatusOr<WorkerCommand> ParseWorkerCommand(const std::vector<std::string>& args);

// The command line of one rank of a daemon job: `binary --daemon ADDR --job ID`.
std::vector<std::string> DaemonRankArgs(const std::string& binary, const std::string& address,
                                        const std::string& job_id);
// The command line of one rank of a standalone job: `binary --standalone JOB.toml`.
std::vector<std::string> StandaloneRankArgs(const std::string& binary,
                                            const std::string& spec_path);

// The command line of a daemon job's launcher on one node of a cluster (Slurm): `binary --daemon
// ADDR --job ID --nproc N --log-dir DIR --nnodes M --node-rank R --rendezvous tcp:HOST:PORT`.
// The values are words as given, so that a batch script may pass shell words ("$SLURM_NODEID").
struct WorkerNodeWords {
  std::string binary, address, job_id, nproc, log_dir, nnodes, node_rank, rendezvous;
};
std::vector<std::string> WorkerNodeArgs(const WorkerNodeWords& w);

}  // namespace ithaca
