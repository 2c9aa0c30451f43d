#include "daemon_link/connection.h"

#include <grpcpp/support/client_interceptor.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon_link/secret_file.h"

namespace ithaca {
namespace {

absl::StatusOr<std::string> ReadWhole(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read it"));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Adds the bearer token to every call's metadata. An interceptor rather than call credentials:
// gRPC sends call credentials only over TLS, and a token over plaintext is legitimate on a
// loopback or unix-socket daemon.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

void ApplyConnectionEnvironment(ConnectionOptions* o) {
  auto fill = [](std::string* field, const char* var, const char* fallback) {
    if (!field->empty()) return;
    const char* v = std::getenv(var);
    *field = v && *v ? v : fallback;
  };
  fill(&o->token_file, kEnvTokenFile, "");
  fill(&o->ca_file, kEnvCa, "");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const ConnectionOptions& o) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (!o.ca_file.empty()) {
    grpc::SslCredentialsOptions ssl;
    absl::StatusOr<std::string> roots = ReadWhole(o.ca_file, "--ca");
    if (!roots.ok()) return roots.status();
    ssl.pem_root_certs = *std::move(roots);
    credentials = grpc::SslCredentials(ssl);
    if (!o.tls_server_name.empty()) {
      args.SetSslTargetNameOverride(o.tls_server_name);
    }
  } else if (!o.tls_server_name.empty()) {
    return absl::InvalidArgumentError("--tls-server-name needs --ca (TLS)");
  }
  if (o.max_reconnect_backoff_ms > 0) {
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(100, o.max_reconnect_backoff_ms));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(100, o.max_reconnect_backoff_ms));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, o.max_reconnect_backoff_ms);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!o.token_file.empty()) {
    // The daemon's rule for its own token file (daemon_link/secret_file.h): a token that other
    // users can read is refused here too, not sent.
    absl::StatusOr<std::string> token = ReadTokenFile(o.token_file, "--token-file");
    if (!token.ok()) return token.status();
    interceptors.push_back(std::make_unique<BearerInterceptorFactory>(*token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(o.server, credentials, args,
                                                                 std::move(interceptors));
}

}  // namespace ithaca
