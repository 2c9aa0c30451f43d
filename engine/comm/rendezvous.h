// Rendezvous addresses and a small key/value exchange on them, used to hand NCCL's unique id
// from rank 0 to the others. "file:/abs/dir" is a directory every rank shares (one machine, or a
// shared filesystem); Gloo uses it through its own FileStore. "tcp:host:port" is the TcpStore
// that node 0's launcher serves (engine/comm/tcp_store.h), for ranks on several machines.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace ithaca {

struct Rendezvous {
  enum class Kind { kFile, kTcp };
  Kind kind = Kind::kFile;
  std::string path;  // kFile: an absolute directory every rank can read and write
  std::string host;  // kTcp: node 0's address (a name or an IPv4 address) and port
  int port = 0;
  std::string address;  // as given, for messages
};

// "file:/abs/dir" (the directory must exist) or "tcp:host:port"; anything else is
// INVALID_ARGUMENT naming the address.
absl::StatusOr<Rendezvous> ParseRendezvous(const std::string& address);

// Publishes `value` under `key`, failing if the key already exists (a directory reused by an
// earlier job would hand out stale values). A file rendezvous writes it atomically (temp file +
// rename).
absl::Status PublishRendezvousValue(const Rendezvous& rdzv, const std::string& key,
                                    const std::string& value, double timeout_s);

// Waits until `key` appears and returns its value; DEADLINE_EXCEEDED after `timeout_s`.
absl::StatusOr<std::string> WaitRendezvousValue(const Rendezvous& rdzv, const std::string& key,
                                                double timeout_s);

}  // namespace ithaca
