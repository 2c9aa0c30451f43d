// Secret files (a bearer token, a TLS key) as the daemon and every caller read them: one rule,
// so that a token file the daemon would refuse is not used silently by the CLI or a worker.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace ithaca {

// A token shorter than this is refused: it would be guessable.
inline constexpr size_t kMinTokenBytes = 16;

// Reads a secret file (a token or a TLS key): a regular file of at most 1 MiB that other users
// cannot read: no permission bits for others, none for the group except read by one of the
// reader's own groups (a Kubernetes Secret volume with fsGroup is 0440, group fsGroup, and
// fsGroup is one of the container's groups). `what` names the flag in errors
// ("--auth-token-file"); errors never quote the file's content.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, const std::string& what);

// The bearer token in a token file: its content less surrounding whitespace, at least
// kMinTokenBytes, printable ASCII without spaces (it travels in an HTTP/2 header).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path, const std::string& what);

}  // namespace ithaca
