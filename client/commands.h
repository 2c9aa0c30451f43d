// The `ithaca` subcommands, each a function of the parsed command line that returns the exit
// code: 0 success; 1 the job (or plan) did not succeed; 2 an RPC or usage error.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "ithaca/v1/job.grpc.pb.h"

namespace ithaca {

struct CliContext {
  std::string server;  // --server: host:port or unix:/path
  bool json = false;   // --json: protobuf JSON (one object per line when streaming)
  std::unique_ptr<v1::JobService::Stub> stub;
};

int SubmitCommand(CliContext& c, const std::string& spec_path, bool follow);
int FollowJob(CliContext& c, const std::string& id);
int StatusCommand(CliContext& c, const std::string& id);
int ListCommand(CliContext& c);
int LogsCommand(CliContext& c, const std::string& id, bool follow, std::optional<int> rank);
int CancelCommand(CliContext& c, const std::string& id);
int PlanCommand(CliContext& c, const std::string& spec_path);
int NodeCommand(CliContext& c);

}  // namespace ithaca
