// Who may talk to ithacad's JobService, and over what: a bearer token (--auth-token-file),
// TLS (--tls-cert / --tls-key), and the rule that a daemon reachable from other machines has at
// least one of them unless --insecure says otherwise.
//
// The token is checked in every JobService handler (JobServiceImpl calls Authorize first): a
// gRPC sync server cannot reject a call from an interceptor with a status of its own, and an
// AuthMetadataProcessor only runs on TLS ports. The standard health service stays open
// (Kubernetes probes carry no token), and so does the workers' WorkerService, which listens on a
// unix socket in a directory only the daemon (and its worker user) can enter.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "daemon_link/secret_file.h"
#include "engine/core/status.h"

namespace ithaca {

// Compares in time that depends only on the lengths, not on where the strings differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

// Checks the `authorization: Bearer <token>` metadata of calls.
class Authenticator {
 public:
  // An empty token: every call is let through.
  explicit Authenticator(std::string token) : token_(std::move(token)) {}
  bool enabled() const { return !token_.empty(); }
  // OK, or UNAUTHENTICATED (the message never quotes what the client sent).
  grpc::Status Authorize(const grpc::ServerContext& context) const;

 private:
  std::string token_;
};

// True for addresses only this machine can reach: 127.0.0.0/8, ::1, "localhost", unix sockets.
// "0.0.0.0", "::", "[::]", other addresses and host names are not.
bool IsLoopbackListen(const std::string& listen);

struct ServerSecurityFlags {
  std::string listen;           // --listen
  std::string auth_token_file;  // --auth-token-file
  std::string tls_cert;         // --tls-cert (PEM chain)
  std::string tls_key;          // --tls-key (PEM)
  bool insecure = false;        // --insecure
};

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;  // TLS or plaintext
  std::shared_ptr<const Authenticator> authenticator;    // never null
  bool tls = false;
  // Printed at start: "TLS, bearer token", "plaintext, no token", ...
  std::string Describe() const;
  // Set when the configuration is allowed but weak off loopback (TLS without a token lets anyone
  // in; a token without TLS travels in clear text); printed at start.
  std::string warning;
};

// Loads the token and the certificate and applies the listen rule. INVALID_ARGUMENT naming the
// flag for a bad file or a lone --tls-cert / --tls-key; FAILED_PRECONDITION when `listen` is not
// loopback and neither a token nor TLS is configured and --insecure is not given.
absl::StatusOr<ServerSecurity> LoadServerSecurity(const ServerSecurityFlags& flags);

}  // namespace ithaca
