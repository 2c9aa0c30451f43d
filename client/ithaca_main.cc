// ithaca: the command line for ithacad (docs/architecture.md).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "client/commands.h"
#include "client/report.h"
#include "client/connection.h"

namespace {

constexpr char kUsage[] =
    "usage: ithaca [--server ADDR] [--token-file FILE] [--ca PEM] [--json] COMMAND ...\n"
    "  submit JOB.toml [--follow]   queue a job; --follow shows progress, exits 0 iff it succeeds\n"
    "  watch ID                     follow a job (as submit --follow); exits 0 iff it succeeds\n"
    "  status ID                    state, reason, last step, history, memory per tier\n"
    "  list                         every job, newest first\n"
    "  logs ID [-f] [--rank N]      the workers' output (-f: until the job ends)\n"
    "  logs ID --steps              every recorded step and eval report, one JSON object a line\n"
    "  report ID [--out FILE.html]  a self-contained HTML page: plots, spec, plan (ID.html)\n"
    "  cancel ID                    SIGTERM the workers, SIGKILL after the grace period\n"
    "  plan JOB.toml                memory estimate per rank against the node's budget\n"
    "  node                         GPUs or CPU slots, what runs where, the metrics address\n"
    "  --server: host:port or unix:/path (default $ITHACA_SERVER, else 127.0.0.1:50051)\n"
    "  --token-file: bearer token for a daemon with --auth-token-file ($ITHACA_TOKEN_FILE)\n"
    "  --ca: CA certificate (PEM) to verify a daemon with --tls-cert; TLS ($ITHACA_CA)\n"
    "  --tls-server-name: the name the daemon's certificate carries, if not the host's\n"
    "  --json: protobuf JSON output (one object per line when streaming)\n";

int Usage(const char* msg = nullptr) {
  if (msg) std::fprintf(stderr, "ithaca: %s\n", msg);
  std::fprintf(stderr, "%s", kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ithaca::CliContext c;
  ithaca::ConnectionOptions connection;
  std::vector<std::string> args;
  bool follow = false;
  std::optional<int> rank;
  bool steps = false;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // --flag VALUE or --flag=VALUE.
    auto value_of = [&](const char* flag, std::string* value) {
      const std::string f = flag;
      if (a == f && i + 1 < argc) {
        *value = argv[++i];
        return true;
      }
      if (a.rfind(f + "=", 0) == 0) {
        *value = a.substr(f.size() + 1);
        return true;
      }
      return false;
    };
    if (value_of("--server", &connection.server) ||
        value_of("--token-file", &connection.token_file) || value_of("--ca", &connection.ca_file) ||
        value_of("--tls-server-name", &connection.tls_server_name)) {
      continue;
    }
    if (a == "--json") {
      c.json = true;
    } else if (a == "--follow" || a == "-f") {
      follow = true;
    } else if (a == "--rank" && i + 1 < argc) {
      int r = 0;
      if (!absl::SimpleAtoi(argv[++i], &r)) return Usage("--rank: not a number");
      rank = r;
    } else if (a == "--steps") {
      steps = true;
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "-h" || a == "--help") {
      std::printf("%s", kUsage);
      return 0;
    } else if (a.rfind("-", 0) == 0) {
      return Usage(("unknown flag " + a).c_str());
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) return Usage();
  ithaca::ApplyConnectionEnvironment(&connection);
  c.server = connection.server;
  auto channel = ithaca::Connect(connection);
  if (!channel.ok()) {
    std::fprintf(stderr, "ithaca: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  c.stub = ithaca::v1::JobService::NewStub(*channel);
  const std::string& cmd = args[0];
  auto need = [&](size_t n) { return args.size() == n + 1; };
  if (cmd == "submit" && need(1)) return ithaca::SubmitCommand(c, args[1], follow);
  if (cmd == "status" && need(1)) return ithaca::StatusCommand(c, args[1]);
  if (cmd == "list" && need(0)) return ithaca::ListCommand(c);
  if (cmd == "logs" && need(1) && steps) return ithaca::StepsCommand(c, args[1]);
  if (cmd == "logs" && need(1)) return ithaca::LogsCommand(c, args[1], follow, rank);
  if (cmd == "report" && need(1)) return ithaca::ReportCommand(c, args[1], out);
  if (cmd == "cancel" && need(1)) return ithaca::CancelCommand(c, args[1]);
  if (cmd == "plan" && need(1)) return ithaca::PlanCommand(c, args[1]);
  if (cmd == "node" && need(0)) return ithaca::NodeCommand(c);
  if (cmd == "watch" && need(1)) return ithaca::FollowJob(c, args[1]);
  return Usage(("bad command line for \"" + cmd + "\"").c_str());
}
