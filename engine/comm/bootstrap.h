// Bootstrap: how a rank process learns who it is (ITHACA_* environment variables, set by the
// local launcher or the daemon) and joins its communicator.
#pragma once

#include <memory>
#include <string>

#include "engine/comm/comm.h"
#include "engine/comm/rank_env.h"  // the variables a launcher sets for each rank
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace ithaca {

struct RankInfo {
  int rank = 0;
  int world = 1;
  int local_world = 0;     // the job's ranks on this host, which share its memory; 0: world
  int gpu = -1;            // the CUDA device of this rank; -1: not assigned (CPU runs)
  std::string rendezvous;  // "file:/abs/dir"; may be empty when world == 1
  std::string gloo_host = "127.0.0.1";
  int gloo_issue_delay_ms = 0;  // tests only (kEnvGlooIssueDelay)
};

// Reads ITHACA_RANK, ITHACA_WORLD_SIZE, ITHACA_LOCAL_WORLD_SIZE, ITHACA_RENDEZVOUS, ITHACA_GPU
// (and ITHACA_GLOO_HOST).
// NOT_FOUND when ITHACA_RANK is unset (not launched as a rank); INVALID_ARGUMENT naming the
// variable for a missing or malformed value, a rank outside [0, world), or world > 1 without a
// rendezvous.
absl::StatusOr<RankInfo> RankInfoFromEnvironment();

// The communicator of this rank: world 1 on the CPU is a SelfComm; otherwise Gloo for
// Device::kCpu and NCCL (on info.gpu) for Device::kCuda. `timeout_s` bounds joining and every
// collective.
absl::StatusOr<std::unique_ptr<Comm>> ConnectComm(const RankInfo& info, Device device,
                                                  double timeout_s);

}  // namespace ithaca
