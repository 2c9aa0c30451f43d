// The `ithaca` subcommands, each a function of the parsed command line that returns the exit
// code: 0 success; 1 the job (or plan) did not succeed; 2 an RPC or usage error.
#pragma once

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

// Prints a failed RPC as "ithaca: SERVER: CODE: message" (a hint when the daemon is not
// reachable) and returns exit code 2. Inline: the report library uses it too.
inline int RpcError(const CliContext& c, const grpc::Status& st) {
  const std::string code =
      st.error_code() == grpc::StatusCode::UNAVAILABLE
          ? "UNAVAILABLE (is ithacad running?)"
          : absl::StatusCodeToString(static_cast<absl::StatusCode>(st.error_code()));
  std::fprintf(stderr, "ithaca: %s: %s: %s\n", c.server.c_str(), code.c_str(),
               st.error_message().c_str());
  return 2;
}

// Runs `args` = {COMMAND, its arguments and flags...}; each command takes only its own flags.
int RunCommand(CliContext& c, const std::vector<std::string>& args);

}  // namespace ithaca
