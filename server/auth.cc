#include "server/auth.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/core/file_util.h"

namespace ithaca {
namespace {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  ASSIGN_OR_RETURN(std::string pem, ReadFileToString(path));
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a PEM file"));
  }
  return pem;
}

}  // namespace

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Every byte of `b` is visited whatever `a` holds, so the time says nothing about where a
  // guess goes wrong (only about the expected token's length, which is not secret).
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

grpc::Status Authenticator::Authorize(const grpc::ServerContext& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this ithacad needs a bearer token (ithaca --token-file FILE)");
  }
  const std::string value(it->second.data(), it->second.size());
  constexpr char kBearer[] = "Bearer ";
  const bool bearer = value.size() > sizeof(kBearer) - 1 &&
                      absl::EqualsIgnoreCase(value.substr(0, sizeof(kBearer) - 1), kBearer);
  if (!bearer || !ConstantTimeEquals(value.substr(sizeof(kBearer) - 1), token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  }
  return grpc::Status::OK;
}

bool IsLoopbackListen(const std::string& listen) {
  if (absl::StartsWith(listen, "unix:") || absl::StartsWith(listen, "unix-abstract:")) return true;
  // host:port, [v6]:port; no port: the whole string is the host.
  std::string host = listen;
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    host = host.substr(1, close - 1);
  } else if (std::count(host.begin(), host.end(), ':') == 1) {
    host = host.substr(0, host.find(':'));
  }
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  unsigned char addr[16];
  if (inet_pton(AF_INET, host.c_str(), addr) == 1) return addr[0] == 127;
  if (inet_pton(AF_INET6, host.c_str(), addr) == 1) {
    static const unsigned char kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    return std::memcmp(addr, kLoopback6, 16) == 0;
  }
  return false;  // a host name or an unparsable address: assume it is reachable
}

std::string ServerSecurity::Describe() const {
  return absl::StrCat(tls ? "TLS" : "plaintext", ", ",
                      authenticator->enabled() ? "bearer token" : "no token");
}

absl::StatusOr<ServerSecurity> LoadServerSecurity(const ServerSecurityFlags& flags) {
  ServerSecurity s;
  std::string token;
  if (!flags.auth_token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadTokenFile(flags.auth_token_file, "--auth-token-file"));
  }
  s.authenticator = std::make_shared<Authenticator>(token);
  if (flags.tls_cert.empty() != flags.tls_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flags.tls_cert.empty() ? "--tls-key" : "--tls-cert", " needs ",
                     flags.tls_cert.empty() ? "--tls-cert" : "--tls-key", " too"));
  }
  if (!flags.tls_cert.empty()) {
    grpc::SslServerCredentialsOptions options;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile(flags.tls_cert, "--tls-cert"));
    ASSIGN_OR_RETURN(pair.private_key, ReadSecretFile(flags.tls_key, "--tls-key"));
    if (!absl::StrContains(pair.private_key, "PRIVATE KEY-----")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls-key ", flags.tls_key, ": not a PEM private key"));
    }
    options.pem_key_cert_pairs.push_back(std::move(pair));
    s.credentials = grpc::SslServerCredentials(options);
    s.tls = true;
  } else {
    s.credentials = grpc::InsecureServerCredentials();
  }
  const bool reachable = !IsLoopbackListen(flags.listen);
  if (reachable && s.tls && !s.authenticator->enabled()) {
    s.warning = "TLS without --auth-token-file: anyone who can reach --listen can run jobs";
  } else if (reachable && !s.tls && s.authenticator->enabled()) {
    s.warning = "--auth-token-file without TLS: the token crosses the network in clear text";
  }
  if (reachable && !s.tls && !s.authenticator->enabled() && !flags.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--listen ", flags.listen,
        " is reachable from other machines and no --auth-token-file or --tls-cert/--tls-key is "
        "given: anyone who can reach it could run jobs as this daemon's user. Configure a token "
        "and/or TLS, listen on 127.0.0.1, or pass --insecure to accept that"));
  }
  return s;
}

}  // namespace ithaca
