#include "engine/comm/bootstrap.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "engine/comm/gloo/gloo_comm.h"
#include "engine/comm/nccl/nccl_connect.h"
#include "engine/comm/self_comm.h"

namespace ithaca {
namespace {

absl::StatusOr<int> IntFromEnv(const char* name, int min_value) {
  const char* value = std::getenv(name);
  if (value == nullptr || value[0] == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not set"));
  }
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < min_value) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", value, "\": expected an integer >= ", min_value));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<RankInfo> RankInfoFromEnvironment() {
  if (std::getenv(kEnvRank) == nullptr) {
    return absl::NotFoundError(absl::StrCat(kEnvRank, " is not set: not launched as a rank"));
  }
  RankInfo info;
  ASSIGN_OR_RETURN(info.rank, IntFromEnv(kEnvRank, 0));
  ASSIGN_OR_RETURN(info.world, IntFromEnv(kEnvWorldSize, 1));
  if (const char* l = std::getenv(kEnvLocalWorldSize); l != nullptr && l[0] != '\0') {
    ASSIGN_OR_RETURN(info.local_world, IntFromEnv(kEnvLocalWorldSize, 1));
    if (info.local_world < 1 || info.local_world > info.world) {
      return absl::InvalidArgumentError(absl::StrCat(kEnvLocalWorldSize, "=", info.local_world,
                                                     " is not in [1, ", kEnvWorldSize, "=",
                                                     info.world, "]"));
    }
  }
  if (info.rank >= info.world) {
    return absl::InvalidArgumentError(
        absl::StrCat(kEnvRank, "=", info.rank, " is not below ", kEnvWorldSize, "=", info.world));
  }
  if (const char* gpu = std::getenv(kEnvGpu); gpu != nullptr && gpu[0] != '\0') {
    ASSIGN_OR_RETURN(info.gpu, IntFromEnv(kEnvGpu, 0));
  }
  if (const char* r = std::getenv(kEnvRendezvous); r != nullptr) info.rendezvous = r;
  if (info.world > 1 && info.rendezvous.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kEnvRendezvous, " is not set; ", info.world,
                                                   " ranks need one (file:/abs/dir)"));
  }
  if (const char* host = std::getenv(kEnvGlooHost); host != nullptr && host[0] != '\0') {
    info.gloo_host = host;
  }
  if (const char* d = std::getenv(kEnvGlooIssueDelay); d != nullptr && d[0] != '\0') {
    ASSIGN_OR_RETURN(info.gloo_issue_delay_ms, IntFromEnv(kEnvGlooIssueDelay, 0));
  }
  return info;
}

absl::StatusOr<std::unique_ptr<Comm>> ConnectComm(const RankInfo& info, Device device,
                                                  double timeout_s) {
  if (device == Device::kCuda) {
    return ConnectNccl(info.rank, info.world, info.rendezvous, info.gpu, timeout_s);
  }
  if (info.world == 1) {
    if (info.rank != 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", info.rank, " of a world of 1"));
    }
    return std::unique_ptr<Comm>(new SelfComm());
  }
  GlooOptions options;
  options.timeout_s = timeout_s;
  options.hostname = info.gloo_host;
  options.issue_delay_ms = info.gloo_issue_delay_ms;
  ASSIGN_OR_RETURN(auto comm, GlooComm::Create(info.rank, info.world, info.rendezvous, options));
  return std::unique_ptr<Comm>(std::move(comm));
}

}  // namespace ithaca
