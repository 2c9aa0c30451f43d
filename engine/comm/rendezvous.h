// Rendezvous addresses ("file:/abs/dir") and a small file-based key/value exchange on them, used
// to hand NCCL's unique id from rank 0 to the others. Gloo uses the same directory through its
// own FileStore.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

struct Rendezvous {
  enum class Kind { kFile };
  Kind kind = Kind::kFile;
  std::string path;  // kFile: an absolute directory every rank can read and write
};

// "file:/abs/dir". "tcp:host:port" is recognized and reported as not available in this build
// (Debian's Gloo has no TCP store); anything else is INVALID_ARGUMENT.
absl::StatusOr<Rendezvous> ParseRendezvous(const std::string& address);

// Writes `value` under `key` atomically (temp file + rename), failing if the key already exists
// (a directory reused by an earlier job would hand out stale values).
absl::Status PublishRendezvousValue(const std::string& dir, const std::string& key,
                                    const std::string& value);

// Polls until `key` appears and returns its value; DEADLINE_EXCEEDED after `timeout_s`.
absl::StatusOr<std::string> WaitRendezvousValue(const std::string& dir, const std::string& key,
                                                double timeout_s);

}  // namespace ithaca
