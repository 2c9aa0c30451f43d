#include "launch/worker_command.h"

#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ithaca {
namespace {

// The largest count a flag takes (ranks, nodes) and the largest memory, in GiB, a rehearsed
// GPU or host may claim.
constexpr int kMaxCount = 4096;
constexpr double kMaxGiB = 1 << 20;

struct Mode {
  const char* flag;
  WorkerMode mode;
  bool takes_value;
  std::set<std::string> flags;  // the other flags the mode takes
};

const std::vector<Mode>& Modes() {
  static const auto* modes = new std::vector<Mode>{
      {"--standalone",
       WorkerMode::kStandalone,
       true,
       {"--nproc", "--nnodes", "--node-rank", "--rendezvous"}},
      {"--daemon",
       WorkerMode::kDaemon,
       true,
       {"--job", "--nproc", "--nnodes", "--node-rank", "--rendezvous", "--log-dir"}},
      {"--plan", WorkerMode::kPlan, true, {}},
      {"--rehearse",
       WorkerMode::kRehearse,
       true,
       {"--rank", "--nodes", "--link", "--device-memory-gib", "--node-host-gib"}},
      {"--libraries", WorkerMode::kLibraries, false, {}},
  };
  return *modes;
}

const Mode* FindMode(const std::string& flag) {
  for (const Mode& m : Modes()) {
    if (flag == m.flag) return &m;
  }
  return nullptr;
}

// A flag of some mode (not necessarily the one given).
bool KnownFlag(const std::string& flag) {
  for (const Mode& m : Modes()) {
    if (flag == m.flag || m.flags.count(flag) != 0) return true;
  }
  return false;
}

absl::StatusOr<int> Count(const std::string& flag, const std::string& value, int min_value) {
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < min_value || v > kMaxCount) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", value, ": expected a number from ", min_value, " to ", kMaxCount));
  }
  return static_cast<int>(v);
}

absl::StatusOr<double> Gib(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double gib = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !(gib > 0) || gib > kMaxGiB) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", value, ": expected GiB, a number above 0"));
  }
  return gib;
}

// Sets the member of `c` that `flag` (one its mode takes) names.
absl::Status Apply(const std::string& flag, const std::string& value, WorkerCommand& c) {
  if (flag == "--job") {
    c.job_id = value;
  } else if (flag == "--nproc") {
    ASSIGN_OR_RETURN(c.nproc, Count(flag, value, 1));
  } else if (flag == "--nnodes") {
    ASSIGN_OR_RETURN(c.nnodes, Count(flag, value, 1));
  } else if (flag == "--node-rank") {
    ASSIGN_OR_RETURN(c.node_rank, Count(flag, value, 0));
  } else if (flag == "--rendezvous") {
    c.rendezvous = value;
  } else if (flag == "--log-dir") {
    c.log_dir = value;
  } else if (flag == "--rank") {
    ASSIGN_OR_RETURN(c.rank, Count(flag, value, 0));
  } else if (flag == "--nodes") {
    ASSIGN_OR_RETURN(c.nodes, Count(flag, value, 1));
  } else if (flag == "--link") {
    c.link = value;
  } else if (flag == "--device-memory-gib") {
    ASSIGN_OR_RETURN(c.device_memory_gib, Gib(flag, value));
  } else if (flag == "--node-host-gib") {
    ASSIGN_OR_RETURN(c.node_host_gib, Gib(flag, value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<WorkerCommand> ParseWorkerCommand(const std::vector<std::string>& args) {
  // First the mode, wherever it stands (`--nproc 2 --standalone job.toml` is fine).
  const Mode* mode = nullptr;
  for (const std::string& a : args) {
    const Mode* m = FindMode(a);
    if (m == nullptr) continue;
    if (mode != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(mode->flag, " and ", m->flag, ": one mode at a time"));
    }
    mode = m;
  }
  if (mode == nullptr) {
    for (const std::string& a : args) {
      if (!KnownFlag(a)) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
    return absl::InvalidArgumentError(
        "no mode: expected --standalone, --daemon, --plan, --rehearse or --libraries");
  }
  WorkerCommand c;
  c.mode = mode->mode;
  std::set<std::string> seen;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    const bool is_mode = flag == mode->flag;
    if (!is_mode && mode->flags.count(flag) == 0) {
      if (!KnownFlag(flag)) return absl::InvalidArgumentError(absl::StrCat("unknown flag ", flag));
      return absl::InvalidArgumentError(absl::StrCat(flag, ": not a flag of ", mode->flag));
    }
    if (!seen.insert(flag).second) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": given twice"));
    }
    if (is_mode && !mode->takes_value) continue;
    if (i + 1 == args.size()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": needs a value"));
    }
    const std::string& value = args[++i];
    if (is_mode) {
      c.target = value;
    } else {
      RETURN_IF_ERROR(Apply(flag, value, c));
      if (flag != "--job" && c.mode != WorkerMode::kRehearse) c.launcher = true;
    }
  }
  if (c.mode == WorkerMode::kDaemon && c.launcher && seen.count("--nproc") == 0) {
    return absl::InvalidArgumentError(
        "--daemon: --nnodes, --node-rank, --rendezvous and --log-dir are the node launcher's: "
        "give --nproc N with them");
  }
  return c;
}

std::vector<std::string> DaemonRankArgs(const std::string& binary, const std::string& address,
                                        const std::string& job_id) {
  return {binary, "--daemon", address, "--job", job_id};
}

std::vector<std::string> StandaloneRankArgs(const std::string& binary,
                                            const std::string& spec_path) {
  return {binary, "--standalone", spec_path};
}

std::vector<std::string> WorkerNodeArgs(const WorkerNodeWords& w) {
  return {w.binary,  "--daemon",    w.address,   "--job",        w.job_id,
          "--nproc", w.nproc,       "--log-dir", w.log_dir,      "--nnodes",
          w.nnodes,  "--node-rank", w.node_rank, "--rendezvous", w.rendezvous};
}

}  // namespace ithaca
