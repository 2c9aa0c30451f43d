// What a rank and ithacad agree on for the WorkerService beyond worker.proto: how a rank names
// the daemon's address, and the metadata key that carries the job's secret on every call.
#pragma once

#include <string>

namespace ithaca {

// Every WorkerService call of a rank carries ITHACA_JOB_SECRET under this key. On ithacad's TCP
// port (ranks on other nodes) a call without the secret of the job it names is refused, so the
// bearer token that clients share does not let them pose as a job's ranks.
inline constexpr char kJobSecretMetadata[] = "x-ithaca-job-secret";

// A unix socket ("unix:/path", or a bare path) rather than host:port over TCP.
inline bool IsUnixAddress(const std::string& address) {
  return address.rfind("unix:", 0) == 0 || address.rfind('/', 0) == 0 || address.rfind('.', 0) == 0;
}

}  // namespace ithaca
