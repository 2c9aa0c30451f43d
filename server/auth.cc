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

constexpr off_t kMaxSecretBytes = 1 << 20;

bool IsOwnGroup(gid_t gid) {
  if (gid == getegid() || gid == getgid()) return true;
  const int n = getgroups(0, nullptr);
  if (n <= 0) return false;
  std::vector<gid_t> groups(n);
  const int got = getgroups(n, groups.data());
  return got > 0 && std::find(groups.begin(), groups.begin() + got, gid) != groups.begin() + got;
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const std::string& what) {
  ASSIGN_OR_RETURN(std::string pem, ReadFileToString(path));
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": not a PEM file"));
  }
  return pem;
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what) {
  auto bad = [&](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": ", msg));
  };
  // O_NONBLOCK: a FIFO must not hang the daemon's start (it is refused below).
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return bad(std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return bad("not a regular file");
  }
  const mode_t group_bits = st.st_mode & 070, other_bits = st.st_mode & 007;
  if (other_bits != 0 || (group_bits & 030) != 0 || (group_bits != 0 && !IsOwnGroup(st.st_gid))) {
    close(fd);
    return bad(absl::StrCat("readable or writable by other users (mode ",
                            absl::StrFormat("%04o", st.st_mode & 07777), "); chmod 600 it"));
  }
  if (st.st_size > kMaxSecretBytes) {
    close(fd);
    return bad(absl::StrCat("larger than ", kMaxSecretBytes, " bytes"));
  }
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < content.size()) {
    const ssize_t n = read(fd, content.data() + got, content.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  content.resize(got);
  return content;
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& what) {
  ASSIGN_OR_RETURN(std::string content, ReadSecretFile(path, what));
  const std::string token(absl::StripAsciiWhitespace(content));
  if (token.size() < kMinTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, ": the token has ",
                                                   token.size(), " bytes; at least ",
                                                   kMinTokenBytes, " are needed"));
  }
  for (char c : token) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", path,
                       ": the token must be printable ASCII without spaces (it is sent in an "
                       "HTTP header); e.g. openssl rand -hex 32"));
    }
  }
  return token;
}

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
