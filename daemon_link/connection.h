// How the CLI reaches ithacad: plaintext or TLS (a CA to verify the daemon's certificate), with
// or without a bearer token (server/auth.h). The one place that makes the CLI's channel.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ithaca {

// The environment a caller's credentials come from when no flag gives them (a Slurm job's ranks
// get them so from ithacad).
inline constexpr char kEnvTokenFile[] = "ITHACA_TOKEN_FILE";
inline constexpr char kEnvCa[] = "ITHACA_CA";
// The daemon's address when --server is not given (DefaultServer, client/commands.h).
inline constexpr char kEnvServer[] = "ITHACA_SERVER";

struct ConnectionOptions {
  std::string server;           // host:port or unix:/path
  std::string token_file;       // --token-file / $ITHACA_TOKEN_FILE: sent as a bearer token
  std::string ca_file;          // --ca / $ITHACA_CA: PEM roots; set: TLS
  std::string tls_server_name;  // --tls-server-name: the name the certificate must carry
  // Set (a worker, whose daemon may restart): reconnect within this long of the daemon's return.
  int max_reconnect_backoff_ms = 0;
};

// Fills the unset credential fields from $ITHACA_TOKEN_FILE and $ITHACA_CA. (The address comes
// from --server or DefaultServer() in commands.h.)
void ApplyConnectionEnvironment(ConnectionOptions* options);

// A channel to the daemon; every call on it carries `authorization: Bearer <token>` when a token
// file is given. INVALID_ARGUMENT naming the flag for a file that cannot be read or holds no
// token (the message never quotes the file).
absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const ConnectionOptions& options);

}  // namespace ithaca
