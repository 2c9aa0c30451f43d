// ithaca: the command line for ithacad (docs/architecture.md).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "client/commands.h"

namespace {

int Usage(const char* msg = nullptr) {
  if (msg) std::fprintf(stderr, "ithaca: %s\n", msg);
  std::fprintf(stderr, "%s", ithaca::kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  ithaca::CliContext c;
  c.server = ithaca::DefaultServer();
  // Global flags may come anywhere; everything else is the command's (commands.cc).
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--server" && i + 1 < argc) {
      c.server = argv[++i];
    } else if (a.rfind("--server=", 0) == 0) {
      c.server = a.substr(9);
    } else if (a == "--json") {
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
  c.stub = ithaca::v1::JobService::NewStub(
      grpc::CreateChannel(c.server, grpc::InsecureChannelCredentials()));
  return ithaca::RunCommand(c, args);
}
