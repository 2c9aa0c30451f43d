// ithaca-worker: one training rank. Modes:
//   --standalone JOB.toml   train without a daemon (development, benchmarks, the demo)
//   --standalone JOB.toml --nproc N   the same as N local ranks (worker/local_launch.h)
//   --standalone JOB.toml --nproc N --nnodes M --node-rank R --rendezvous tcp:HOST:PORT
//                             this machine's N ranks of a job on M machines (torchrun's shape)
//   --daemon ADDR --job ID    one rank of a job launched by ithacad (worker/daemon_mode.h); ADDR
//                             is ithacad's worker socket, or host:port over TCP
//   --daemon ADDR --job ID --nproc N [--nnodes M --node-rank R --rendezvous tcp:HOST:PORT]
//                             [--log-dir DIR]   this node's N ranks of a daemon job a cluster
//                             (Slurm) started: one launcher per node (worker/local_launch.h)
//   --plan JOB.toml           print the job's memory plan per tier (engine/plan)
//   --rehearse JOB.toml [--rank R] [--nodes M] [--link L] [--device-memory-gib G]
//                             [--node-host-gib H]   one rank of the job alone on this GPU, its
//                             collectives modeled (docs/rehearsal.md)
//   --libraries               print the cuDNN and NCCL versions loaded and built against
// The command line is parsed by launch/worker_command.h, which also builds the lines ithacad and
// the launchers start ranks with; a flag the mode does not take is refused.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "engine/runtime/backend.h"
#include "launch/exit_codes.h"
#include "worker/local_launch.h"
#include "launch/worker_command.h"
#include "worker/daemon_mode.h"
#include "worker/standalone.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: ithaca-worker --standalone JOB.toml [--nproc N]\n"
               "         [--nnodes M --node-rank R --rendezvous tcp:HOST:PORT]\n"
               "       ithaca-worker --plan JOB.toml\n"
               "       ithaca-worker --rehearse JOB.toml [--rank R] [--nodes M] [--link L]\n"
               "         [--device-memory-gib G] [--node-host-gib H]\n"
               "       ithaca-worker --libraries   (the cuDNN and NCCL it loads)\n"
               "  Trains the job in this process (no daemon) and prints one line per step;\n"
               "  with --nproc, as N ranks on this machine (rank 0's output shown, the\n"
               "  others' prefixed \"[rank r]\"); with --nnodes, as this machine's share of a\n"
               "  job on M machines: run it on each, R = 0..M-1; node 0 serves the rendezvous\n"
               "  on PORT, and HOST must reach node 0.\n"
               "  --rehearse runs rank R of the job's parallel.world alone on this GPU: its\n"
               "  memory and step time, with collectives as copies held for the link model's\n"
               "  time (L: h100-sxm | h200-sxm | zero, then nvlink_gbps=, nvlink_us=, ib_gbps=,\n"
               "  ib_us=), on M nodes with G GiB GPUs and H GiB hosts (docs/rehearsal.md).\n");
}

// This binary's path, for the ranks a launcher starts.
std::string SelfPath(const char* argv0) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return n > 0 ? std::string(exe, n) : std::string(argv0);
}

// How a launch ended, as the launcher process's exit code.
int LaunchExitCode(const absl::Status& st, const ithaca::LaunchReport& report) {
  if (report.forwarded_signal != 0) return ithaca::kExitKilled;
  if (report.first_failure < 0) {
    // A bad flag is the user's to fix, like a bad job spec.
    return st.code() == absl::StatusCode::kInvalidArgument ? ithaca::kExitBadSpec
                                                           : ithaca::kExitError;
  }
  return report.ExitCode();
}

// `--standalone JOB --nproc N [--nnodes M --node-rank R --rendezvous tcp:HOST:PORT]`: runs this
// binary N times with `--standalone JOB` as ranks.
int LaunchStandalone(const char* argv0, const ithaca::WorkerCommand& c) {
  ithaca::LaunchOptions options;
  options.argv = ithaca::StandaloneRankArgs(SelfPath(argv0), c.target);
  options.nproc = c.nproc;
  options.nnodes = c.nnodes;
  options.node_rank = c.node_rank;
  options.rendezvous = c.rendezvous;
  ithaca::LaunchReport report;
  absl::Status st = ithaca::LaunchLocal(options, &report);
  if (st.ok()) return 0;
  std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
  return LaunchExitCode(st, report);
}

// `--daemon ADDR --job ID --nproc N [--nnodes M --node-rank R --rendezvous tcp:HOST:PORT]
// [--log-dir DIR]`: this node's N ranks of a daemon job that a cluster (Slurm) started, one
// launcher per node; each rank runs `--daemon ADDR --job ID` and reports to ithacad itself.
// With --log-dir, rank r writes DIR/rank-r.log (as ranks ithacad forks do); the launcher's own
// lines stay on its stdout and stderr.
int LaunchDaemonNode(const char* argv0, const ithaca::WorkerCommand& c) {
  if (c.target.empty() || c.job_id.empty()) {
    std::fprintf(stderr, "ithaca-worker: --daemon ADDR and --job ID are both required\n");
    return ithaca::kExitBadSpec;
  }
  ithaca::LaunchOptions options;
  options.argv = ithaca::DaemonRankArgs(SelfPath(argv0), c.target, c.job_id);
  options.nproc = c.nproc;
  options.nnodes = c.nnodes;
  options.node_rank = c.node_rank;
  options.rendezvous = c.rendezvous;
  options.log_dir = c.log_dir;
  // Daemon ranks take SIGUSR1 as a drain: Slurm's warning before a time limit or a preemption
  // (`#SBATCH --signal`, server/slurm.h) reaches them through this launcher too.
  options.forward_drain = true;
  options.on_rank_killed = [&](int rank, const ithaca::WorkerEnd& end) {
    ithaca::ReportKilledRank(c.target, c.job_id, rank, end.code);
  };
  int rank0_fd = -1;
  if (!c.log_dir.empty()) {  // the node's first rank writes to the launcher's fds: its file here
    const std::string path = ithaca::RankLogPath(c.log_dir, options.node_rank * options.nproc);
    rank0_fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (rank0_fd < 0) {
      std::fprintf(stderr, "ithaca-worker: cannot open %s: %s\n", path.c_str(), strerror(errno));
      return ithaca::kExitError;
    }
    options.out_fd = options.err_fd = rank0_fd;
  }
  ithaca::LaunchReport report;
  absl::Status st = ithaca::LaunchLocal(options, &report);
  if (rank0_fd >= 0) close(rank0_fd);
  if (st.ok()) return 0;
  std::fprintf(stderr, "ithaca-worker: node %d: %s\n", options.node_rank, st.ToString().c_str());
  return LaunchExitCode(st, report);
}

// `--rehearse JOB`'s flags over RehearsalArgs' defaults.
ithaca::RehearsalArgs RehearsalArgsFrom(const ithaca::WorkerCommand& c) {
  ithaca::RehearsalArgs args;
  if (c.rank >= 0) args.rank = c.rank;
  if (c.nodes >= 1) args.nodes = c.nodes;
  if (!c.link.empty()) args.link = c.link;
  if (c.device_memory_gib > 0) args.device_memory_gib = c.device_memory_gib;
  if (c.node_host_gib > 0) args.node_host_gib = c.node_host_gib;
  return args;
}

// A mode's end: 0, or its error printed and its exit code.
int Finish(const absl::Status& st) {
  if (st.ok()) return 0;
  std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
  return ithaca::ExitCodeFor(st);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args == std::vector<std::string>{"--help"} ||
      args == std::vector<std::string>{"-h"}) {
    Usage();
    return ithaca::kExitBadSpec;
  }
  absl::StatusOr<ithaca::WorkerCommand> command = ithaca::ParseWorkerCommand(args);
  if (!command.ok()) {
    std::fprintf(stderr, "ithaca-worker: %s\n", std::string(command.status().message()).c_str());
    Usage();
    return ithaca::kExitBadSpec;
  }
  const ithaca::WorkerCommand& c = *command;
  switch (c.mode) {
    case ithaca::WorkerMode::kDaemon: {
      if (c.launcher) return LaunchDaemonNode(argv[0], c);
      auto options = ithaca::DaemonWorkerOptionsFromEnv(c.target, c.job_id);
      if (!options.ok()) {
        std::fprintf(stderr, "ithaca-worker: %s\n", options.status().ToString().c_str());
        return ithaca::kExitBadSpec;
      }
      return ithaca::RunDaemonWorker(*options);
    }
    case ithaca::WorkerMode::kStandalone:
      if (c.launcher) return LaunchStandalone(argv[0], c);
      return Finish(ithaca::RunStandalone(c.target));
    case ithaca::WorkerMode::kRehearse:
      return Finish(ithaca::RunRehearsal(c.target, RehearsalArgsFrom(c)));
    case ithaca::WorkerMode::kPlan:
      return Finish(ithaca::PrintPlan(c.target));
    case ithaca::WorkerMode::kLibraries:
      // The cuDNN and NCCL this binary loads, as its ranks will (ithacad asks at start).
      std::printf("%s\n", ithaca::ReportLibraries().line.c_str());
      return 0;
  }
  Usage();
  return ithaca::kExitBadSpec;
}
