// ithaca: the command line for ithacad (docs/architecture.md).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "client/commands.h"
#include "client/connection.h"

namespace {

int Usage(const char* msg = nullptr) {
  if (msg) std::fprintf(stderr, "ithaca: %s\n", msg);
  std::fprintf(stderr, "%s", ithaca::kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ithaca::CliContext c;
  ithaca::ConnectionOptions connection;
  // Global flags may come anywhere; everything else is the command's (commands.cc).
  std::vector<std::string> args;
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
      c.output = ithaca::Output::kJson;
    } else if (a == "-q" || a == "--quiet") {
      c.output = ithaca::Output::kName;
    } else if ((a == "-o" || a == "--output") && i + 1 < argc) {
      if (!ithaca::ParseOutput(argv[++i], &c.output)) {
        return Usage(("-o: expected json, name or wide, got " + std::string(argv[i])).c_str());
      }
    } else if (a.rfind("-o", 0) == 0 && a.size() > 2 && a.rfind("--", 0) != 0) {
      if (!ithaca::ParseOutput(a.substr(a[2] == '=' ? 3 : 2), &c.output)) {
        return Usage(("-o: expected json, name or wide, got " + a).c_str());
      }
    } else if (a.rfind("--output=", 0) == 0) {
      if (!ithaca::ParseOutput(a.substr(9), &c.output)) {
        return Usage(("-o: expected json, name or wide, got " + a).c_str());
      }
    } else if (a == "-h" || a == "--help") {
      std::printf("%s", ithaca::kUsage);
      return 0;
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) return Usage();
  if (connection.server.empty()) connection.server = ithaca::DefaultServer();
  ithaca::ApplyConnectionEnvironment(&connection);
  c.server = connection.server;
  auto channel = ithaca::Connect(connection);
  if (!channel.ok()) {
    std::fprintf(stderr, "ithaca: %s\n", std::string(channel.status().message()).c_str());
    return 2;
  }
  c.stub = ithaca::v1::JobService::NewStub(*channel);
  return ithaca::RunCommand(c, args);
}
