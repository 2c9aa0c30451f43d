// The `ithaca` subcommands, each a function of the parsed command line that returns the exit
// code: 0 success; 1 the job (or plan) did not succeed; 2 an RPC or usage error.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ithaca/v1/job.grpc.pb.h"

namespace ithaca {

enum class Output { kText, kJson, kName, kWide };

struct CliContext {
  std::string server;             // --server: host:port or unix:/path
  Output output = Output::kText;  // -o json|name|wide (--json, -q)
  std::unique_ptr<v1::JobService::Stub> stub;
};

// What `ithaca --help` prints.
extern const char kUsage[];

// Where ithacad is when --server is not given: $ITHACA_SERVER, else the grpc= line of
// $ITHACA_HOME/ithacad.addr (default ~/.ithaca, written by ithacad), else 127.0.0.1:50051.
std::string DefaultServer();

// Parses -o's argument ("json", "name", "wide"); false when it is none of them.
bool ParseOutput(const std::string& name, Output* out);

// Runs `args` = {COMMAND, its arguments and flags...}; each command takes only its own flags.
int RunCommand(CliContext& c, const std::vector<std::string>& args);

}  // namespace ithaca
