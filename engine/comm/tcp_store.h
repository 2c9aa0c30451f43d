// A small TCP key/value store for rendezvous across machines: node 0's launcher serves it
// (TcpStoreServer, one thread), and every rank and every other node's launcher is a client
// (TcpStoreClient). Ranks use it for Gloo's rendezvous and to pass NCCL's unique id; launchers
// use it to learn that another node failed or vanished.
//
// Wire format: every message is a 4-byte little-endian length, then that many bytes. A request
// is an op byte and length-prefixed strings; a reply is a status byte and one string (the value,
// or an error message). Keys, values and messages are bounded (kMaxKeyBytes, kMaxValueBytes), so
// a stray or hostile peer cannot make the server allocate without limit.
//
// Liveness: a launcher registers its connection under a name ("node 1 (host-b)"). If that
// connection drops before the launcher says goodbye, the server records the job as failed, with
// a message naming that node, in kFailedKey; from then on every waiting or later Get of another
// key fails with that message instead of waiting out its timeout.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

inline constexpr size_t kMaxKeyBytes = 4096;
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;
// Set once, by the first node to fail (or by the server for a node whose connection dropped).
inline constexpr char kFailedKey[] = "ithaca/failed";

class TcpStoreServer {
 public:
  // Listens on `host:port` (host "" or "0.0.0.0": every address; port 0: any free port).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port);
  ~TcpStoreServer();  // stops the thread and closes every connection

  int port() const { return port_; }
  // The names registered so far, and those that said goodbye (a clean end).
  std::vector<std::string> Registered() const;
  std::vector<std::string> Finished() const;
  // kFailedKey's value, or "" while no node has failed.
  std::string Failure() const;

 private:
  struct State;
  TcpStoreServer() = default;
  void Serve();

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying refused connections until `timeout_s` (the server's node may
  // start later than this one). `timeout_s` also bounds each request's reply.
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const std::string& host, int port,
                                                                 double timeout_s);
  ~TcpStoreClient();

  // Fails if the key is already set (a value once published never changes).
  absl::Status Set(const std::string& key, const std::string& value);
  // Waits up to `timeout_s` for `key`: DEADLINE_EXCEEDED naming the key, or ABORTED with the
  // failure message when a node has failed meanwhile.
  absl::StatusOr<std::string> Get(const std::string& key, double timeout_s);
  // The value if set, nullopt-like NOT_FOUND otherwise; never waits, never fails for kFailedKey.
  absl::StatusOr<std::string> TryGet(const std::string& key);
  // Names this connection for liveness (see the file comment), and says a clean goodbye.
  absl::Status Register(const std::string& name);
  absl::Status Finish();

  // This end's address of the connection (the interface that reaches the server): where this
  // machine's ranks can listen for their peers.
  std::string LocalAddress() const;
  // "the rendezvous at host:port", for messages.
  std::string Describe() const;

 private:
  TcpStoreClient() = default;
  absl::StatusOr<std::string> Call(const std::string& request, double reply_timeout_s);

  std::mutex mu_;
  int fd_ = -1;
  std::string host_;
  int port_ = 0;
  double timeout_s_ = 60;
};

}  // namespace ithaca
