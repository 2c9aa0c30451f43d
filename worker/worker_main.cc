// ithaca-worker: one training rank. Modes:
//   --standalone JOB.toml   train without a daemon (development, benchmarks, the demo)
//   --standalone JOB.toml --nproc N   the same as N local ranks (worker/launcher.h)
//   --daemon SOCKET --job ID  one rank of a job launched by ithacad (worker/daemon_mode.h)
//   --plan JOB.toml           print the job's memory plan per tier (engine/plan)
//   --libraries               print the cuDNN and NCCL versions loaded and built against
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/comm/nccl/nccl_connect.h"
#include "worker/daemon_mode.h"
#include "worker/exit_codes.h"
#include "worker/launcher.h"
#include "worker/standalone.h"

namespace {

void Usage() {
  std::fprintf(stderr,
               "usage: ithaca-worker --standalone JOB.toml [--nproc N]\n"
               "       ithaca-worker --plan JOB.toml\n"
               "       ithaca-worker --libraries   (the cuDNN and NCCL it loads)\n"
               "  Trains the job in this process (no daemon) and prints one line per step;\n"
               "  with --nproc, as N ranks on this machine (rank 0's output shown, the\n"
               "  others' prefixed \"[rank r]\").\n");
}

// `--standalone JOB --nproc N`: runs this binary N times with `--standalone JOB` as ranks.
int LaunchStandalone(const char* self, const std::string& job, const std::string& nproc) {
  ithaca::LaunchOptions options;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  options.argv = {n > 0 ? std::string(exe, n) : std::string(self), "--standalone", job};
  char* end = nullptr;
  long ranks = std::strtol(nproc.c_str(), &end, 10);
  if (nproc.empty() || *end != '\0' || ranks < 1 || ranks > 4096) {
    std::fprintf(stderr, "ithaca-worker: --nproc %s: expected a number of ranks >= 1\n",
                 nproc.c_str());
    return ithaca::kExitBadSpec;
  }
  options.nproc = static_cast<int>(ranks);
  ithaca::LaunchReport report;
  absl::Status st = ithaca::LaunchLocal(options, &report);
  if (st.ok()) return 0;
  std::fprintf(stderr, "ithaca-worker: %s\n", st.ToString().c_str());
  if (report.forwarded_signal != 0) return ithaca::kExitKilled;
  if (report.first_failure < 0) return ithaca::kExitError;
  return report.ExitCode();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--daemon") == 0) {
    std::string socket, job;
    for (int i = 1; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--daemon") == 0) socket = argv[i + 1];
      if (std::strcmp(argv[i], "--job") == 0) job = argv[i + 1];
    }
    auto options = ithaca::DaemonWorkerOptionsFromEnv(socket, job);
    if (!options.ok()) {
      std::fprintf(stderr, "ithaca-worker: %s\n", options.status().ToString().c_str());
      return ithaca::kExitBadSpec;
    }
    return ithaca::RunDaemonWorker(*options);
  }
  if (argc == 5) {  // --standalone JOB --nproc N, in either order
    std::string job, nproc;
    for (int i = 1; i + 1 < argc; i += 2) {
      if (std::strcmp(argv[i], "--standalone") == 0) job = argv[i + 1];
      if (std::strcmp(argv[i], "--nproc") == 0) nproc = argv[i + 1];
    }
    if (!job.empty() && !nproc.empty()) return LaunchStandalone(argv[0], job, nproc);
  }
  if (argc == 2 && std::strcmp(argv[1], "--libraries") == 0) {
    // The cuDNN and NCCL this binary loads, as its ranks will (ithacad asks at start).
    std::string line;
    for (const auto& report : {ithaca::CudnnVersionReport(), ithaca::NcclVersionReport()}) {
      line += (line.empty() ? "" : ", ") +
              (report.ok() ? *report : std::string(report.status().message()));
    }
    std::printf("%s\n", line.c_str());
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
