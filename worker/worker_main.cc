// ithaca-worker: one training rank. Modes:
//   --standalone JOB.toml   train without a daemon (development, benchmarks, the demo)
//   --standalone JOB.toml --nproc N   the same as N local ranks (launch/launcher.h)
//   --standalone JOB.toml --nproc N --nnodes M --node-rank R --rendezvous tcp:HOST:PORT
//                             this machine's N ranks of a job on M machines (torchrun's shape)
//   --daemon ADDR --job ID    one rank of a job launched by ithacad (worker/daemon_mode.h); ADDR
//                             is ithacad's worker socket, or host:port over TCP
//   --daemon ADDR --job ID --nproc N [--nnodes M --node-rank R --rendezvous tcp:HOST:PORT]
//                             [--log-dir DIR]   this node's N ranks of a daemon job a cluster
//                             (Slurm) started: one launcher per node (launch/launcher.h)
//   --plan JOB.toml           print the job's memory plan per tier (engine/plan)
//   --rehearse JOB.toml [--rank R] [--nodes M] [--link L] [--device-memory-gib G]
//                             [--node-host-gib H]   one rank of the job alone on this GPU, its
//                             collectives modeled (docs/rehearsal.md)
//   --libraries               print the cuDNN and NCCL versions loaded and built against
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/runtime/backend.h"
#include "worker/daemon_mode.h"
#include "launch/exit_codes.h"
#include "launch/launcher.h"
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

// A flag's whole-number value in [min_value, 4096], or -1 after printing what is wrong.
int ParseCount(const char* flag, const std::string& value, int min_value) {
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < min_value || v > 4096) {
    std::fprintf(stderr, "ithaca-worker: %s %s: expected a number from %d to 4096\n", flag,
                 value.c_str(), min_value);
    return -1;
  }
  return static_cast<int>(v);
}

// `--standalone JOB --nproc N [--nnodes M --node-rank R --rendezvous tcp:HOST:PORT]`: runs this
// binary N times with `--standalone JOB` as ranks.
int LaunchStandalone(const char* self, const std::string& job, const std::string& nproc,
                     const std::string& nnodes, const std::string& node_rank,
                     const std::string& rendezvous) {
  ithaca::LaunchOptions options;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  options.argv = {n > 0 ? std::string(exe, n) : std::string(self), "--standalone", job};
  options.nproc = ParseCount("--nproc", nproc.empty() ? "1" : nproc, 1);
  options.nnodes = ParseCount("--nnodes", nnodes.empty() ? "1" : nnodes, 1);
  options.node_rank = ParseCount("--node-rank", node_rank.empty() ? "0" : node_rank, 0);
  if (options.nproc < 0 || options.nnodes < 0 || options.node_rank < 0) {
    return ithaca::kExitBadSpec;
  }
  options.rendezvous = rendezvous;
  ithaca::LaunchReport report;
  absl::Status st = ithaca::LaunchLocal(options, &report);
  if (st.ok()) return 0;
  std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
  if (report.forwarded_signal != 0) return ithaca::kExitKilled;
  if (report.first_failure < 0) {
    // A bad flag is the user's to fix, like a bad job spec.
    return st.code() == absl::StatusCode::kInvalidArgument ? ithaca::kExitBadSpec
                                                           : ithaca::kExitError;
  }
  return report.ExitCode();
}

// `--daemon ADDR --job ID --nproc N [--nnodes M --node-rank R --rendezvous tcp:HOST:PORT]
// [--log-dir DIR]`: this node's N ranks of a daemon job that a cluster (Slurm) started, one
// launcher per node; each rank runs `--daemon ADDR --job ID` and reports to ithacad itself.
// With --log-dir, rank r writes DIR/rank-r.log (as ranks ithacad forks do); the launcher's own
// lines stay on its stdout and stderr.
int LaunchDaemonNode(const char* self, const std::string& address, const std::string& job,
                     const std::string& nproc, const std::string& nnodes,
                     const std::string& node_rank, const std::string& rendezvous,
                     const std::string& log_dir) {
  if (address.empty() || job.empty()) {
    std::fprintf(stderr, "ithaca-worker: --daemon ADDR and --job ID are both required\n");
    return ithaca::kExitBadSpec;
  }
  ithaca::LaunchOptions options;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  options.argv = {n > 0 ? std::string(exe, n) : std::string(self), "--daemon", address, "--job",
                  job};
  options.nproc = ParseCount("--nproc", nproc, 1);
  options.nnodes = ParseCount("--nnodes", nnodes.empty() ? "1" : nnodes, 1);
  options.node_rank = ParseCount("--node-rank", node_rank.empty() ? "0" : node_rank, 0);
  if (options.nproc < 0 || options.nnodes < 0 || options.node_rank < 0) {
    return ithaca::kExitBadSpec;
  }
  options.rendezvous = rendezvous;
  options.log_dir = log_dir;
  // Daemon ranks take SIGUSR1 as a drain: Slurm's warning before a time limit or a preemption
  // (`#SBATCH --signal`, server/slurm.h) reaches them through this launcher too.
  options.forward_drain = true;
  options.on_rank_killed = [&](int rank, const ithaca::WorkerEnd& end) {
    ithaca::ReportKilledRank(address, job, rank, end.code);
  };
  int rank0_fd = -1;
  if (!log_dir.empty()) {  // the node's first rank writes to the launcher's fds: its file here
    const std::string path = ithaca::RankLogPath(log_dir, options.node_rank * options.nproc);
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
  if (report.forwarded_signal != 0) return ithaca::kExitKilled;
  if (report.first_failure < 0) {
    return st.code() == absl::StatusCode::kInvalidArgument ? ithaca::kExitBadSpec
                                                           : ithaca::kExitError;
  }
  return report.ExitCode();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--daemon") == 0) {
    std::string socket, job, nproc, nnodes, node_rank, rendezvous, log_dir;
    bool launcher = false;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--daemon") socket = argv[i + 1];
      if (flag == "--job") job = argv[i + 1];
      if (flag == "--nproc") nproc = argv[i + 1], launcher = true;
      if (flag == "--nnodes") nnodes = argv[i + 1];
      if (flag == "--node-rank") node_rank = argv[i + 1];
      if (flag == "--rendezvous") rendezvous = argv[i + 1];
      if (flag == "--log-dir") log_dir = argv[i + 1];
    }
    if (launcher) {
      return LaunchDaemonNode(argv[0], socket, job, nproc, nnodes, node_rank, rendezvous, log_dir);
    }
    auto options = ithaca::DaemonWorkerOptionsFromEnv(socket, job);
    if (!options.ok()) {
      std::fprintf(stderr, "ithaca-worker: %s\n", options.status().ToString().c_str());
      return ithaca::kExitBadSpec;
    }
    return ithaca::RunDaemonWorker(*options);
  }
  if (argc >= 5 && argc % 2 == 1) {  // --standalone JOB and launch flags, in any order
    std::string job, nproc, nnodes, node_rank, rendezvous;
    bool known = true;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--standalone") {
        job = argv[i + 1];
      } else if (flag == "--nproc") {
        nproc = argv[i + 1];
      } else if (flag == "--nnodes") {
        nnodes = argv[i + 1];
      } else if (flag == "--node-rank") {
        node_rank = argv[i + 1];
      } else if (flag == "--rendezvous") {
        rendezvous = argv[i + 1];
      } else {
        known = false;
      }
    }
    if (known && !job.empty()) {
      return LaunchStandalone(argv[0], job, nproc, nnodes, node_rank, rendezvous);
    }
  }
  if (argc >= 3 && argc % 2 == 1 && std::strcmp(argv[1], "--rehearse") == 0) {
    ithaca::RehearsalArgs args;
    for (int i = 3; i + 1 < argc; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      int parsed = 0;
      if (flag == "--rank" && (parsed = ParseCount("--rank", value, 0)) >= 0) {
        args.rank = parsed;
      } else if (flag == "--nodes" && (parsed = ParseCount("--nodes", value, 1)) >= 0) {
        args.nodes = parsed;
      } else if (flag == "--link") {
        args.link = value;
      } else if (flag == "--device-memory-gib" || flag == "--node-host-gib") {
        char* end = nullptr;
        const double gib = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(gib > 0) || gib > (1 << 20)) {
          std::fprintf(stderr, "ithaca-worker: %s %s: expected GiB, a number above 0\n",
                       flag.c_str(), value.c_str());
          return ithaca::kExitBadSpec;
        }
        (flag == "--device-memory-gib" ? args.device_memory_gib : args.node_host_gib) = gib;
      } else {
        if (parsed >= 0) std::fprintf(stderr, "ithaca-worker: unknown flag %s\n", flag.c_str());
        Usage();
        return ithaca::kExitBadSpec;
      }
    }
    absl::Status st = ithaca::RunRehearsal(argv[2], args);
    if (!st.ok()) {
      std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
      return ithaca::ExitCodeFor(st);
    }
    return 0;
  }
  if (argc == 2 && std::strcmp(argv[1], "--libraries") == 0) {
    // The cuDNN and NCCL this binary loads, as its ranks will (ithacad asks at start).
    std::printf("%s\n", ithaca::ReportLibraries().line.c_str());
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--plan") == 0) {
    absl::Status st = ithaca::PrintPlan(argv[2]);
    if (!st.ok()) {
      std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
      return ithaca::ExitCodeFor(st);
    }
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "--standalone") == 0) {
    absl::Status st = ithaca::RunStandalone(argv[2]);
    if (!st.ok()) {
      std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
      return ithaca::ExitCodeFor(st);
    }
    return 0;
  }
  Usage();
  return ithaca::kExitBadSpec;
}
