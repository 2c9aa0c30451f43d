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

// The version `ithaca --version` prints.
extern const char* const kVersion;  // proto/version.h

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

// One command's flags, as the command line (cli.cc, CLI11) parsed them.
struct Flags {
  std::vector<std::string> ids;  // watch, wait, status, logs, report, cancel
  std::string spec;              // submit, plan: the spec file; "-" reads it from stdin
  bool follow = false;
  bool no_logs = false;
  bool steps = false;
  std::string out;
  std::optional<int> rank;
  std::optional<int> tail;
  int limit = 0;
  std::vector<std::string> sets;
  std::vector<std::string> states;
  std::string reason;
  double timeout_s = 0;      // wait: 0 waits as long as it takes; drain: 0 is the daemon's 300 s
  bool undo = false;         // drain --undo
  bool max_seq_len = false;  // plan: bisect data.seq_len for the longest that fits
  int64_t multiple_of = 1024;
  // plan: a node this daemon is not ("h200x8", "gpus=8,gpu_gib=80,host_gib=2048"): the daemon
  // parses it (server/node.h HardwareNode).
  std::string hardware;
  std::string after;  // submit --after ID: start when that job succeeds
  // plan --then SPEC: the later phases of a chain, in order, after `spec` (each planned with
  // the same --set and --hardware).
  std::vector<std::string> then;
};

// The commands (their exit codes as above).
int SubmitCommand(CliContext& c, const Flags& f);
int WatchCommand(CliContext& c, const std::string& id, bool logs);
// Waits until every job ended: 0 when all succeeded, 1 when one did not or the timeout passed.
int WaitCommand(CliContext& c, const Flags& f);
int StatusCommand(CliContext& c, const std::string& id);
int ListCommand(CliContext& c, const Flags& f);
int LogsCommand(CliContext& c, const std::string& id, const Flags& f);
// Cancels each job (all of them, even after one fails: exit 2 then).
int CancelCommand(CliContext& c, const Flags& f);
// Deletes each ended job (all are tried; exit 2 if one could not be: a live one is refused).
int DeleteCommand(CliContext& c, const Flags& f);
int PlanCommand(CliContext& c, const Flags& f);
// `plan --max-seq-len`: the longest data.seq_len (a multiple of f.multiple_of) whose plan fits,
// found by doubling and then bisecting on the daemon's planner; prints that plan (the
// head_chunk, tile_tokens and offload it turns on). 0, or 1 when not even one multiple fits.
int MaxSeqLenCommand(CliContext& c, const Flags& f);
int NodeCommand(CliContext& c);
// `drain`: the daemon pauses scheduling and drains its running jobs (checkpoint, stop, queued
// again); `drain --undo` starts the queue again. 1 when a running job could not be drained.
int DrainCommand(CliContext& c, const Flags& f);

// Which worker lines `--follow` shows: rank 0's, except its step and eval lines (the progress
// line and the eval events show those), and other ranks' warnings and errors.
bool ShowLogLine(const v1::LogLine& l);

// The whole command line: parses argv (CLI11), connects when the command needs the daemon,
// runs the command; returns the exit code.
int RunCli(int argc, char** argv);

}  // namespace ithaca
