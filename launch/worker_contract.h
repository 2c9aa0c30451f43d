// What a rank and ithacad agree on beyond worker.proto: the environment the daemon starts a
// rank with, how a rank names the daemon's address, and the metadata key that carries the job's
// secret on every call. (The rank's place in the job, ITHACA_RANK, ITHACA_WORLD_SIZE, ... is the
// launcher's, engine/comm/bootstrap.h reads it; the daemon link's ITHACA_TOKEN_FILE and
// ITHACA_CA are daemon_link/connection.h's.)
#pragma once

#include <string>

namespace ithaca {

// The environment of a rank under ithacad (worker/daemon_mode.h reads it).
inline constexpr char kEnvDaemonSocket[] = "ITHACA_DAEMON_SOCKET";  // the local unix socket
inline constexpr char kEnvJobId[] = "ITHACA_JOB_ID";
inline constexpr char kEnvJobSecret[] = "ITHACA_JOB_SECRET";  // sent as kJobSecretMetadata
// A Slurm job's: the file (launch/layout.h JobDaemonAddrPath) holding the host:port to dial.
inline constexpr char kEnvDaemonAddrFile[] = "ITHACA_DAEMON_ADDR_FILE";

// Every WorkerService call of a rank carries ITHACA_JOB_SECRET under this key. On ithacad's TCP
// port (ranks on other nodes) a call without the secret of the job it names is refused, so the
// bearer token that clients share does not let them pose as a job's ranks.
inline constexpr char kJobSecretMetadata[] = "x-ithaca-job-secret";

// A unix socket ("unix:/path", or a bare path) rather than host:port over TCP.
inline bool IsUnixAddress(const std::string& address) {
  return address.rfind("unix:", 0) == 0 || address.rfind('/', 0) == 0 || address.rfind('.', 0) == 0;
}

}  // namespace ithaca
