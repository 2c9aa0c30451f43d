// A launch's part in a job across nodes (`--nnodes M --node-rank R --rendezvous tcp:HOST:PORT`):
// node 0 serves the rendezvous store, and every node (node 0 too) keeps a registered connection
// to it. A node's failure travels as the store's kFailedKey; a launcher that vanishes is noticed
// by the server, which records it there. Used by LaunchLocal (local_launch.cc).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/comm/tcp_store.h"
#include "engine/core/status.h"
#include "worker/local_launch.h"

namespace ithaca {

class NodeLink {
 public:
  // Joins the job's rendezvous (serving it on node 0); `o` must outlive the link.
  static absl::StatusOr<std::unique_ptr<NodeLink>> Join(const LaunchOptions& o);

  const std::string& name() const { return name_; }
  // Where this node's ranks listen for their peers: the interface that reaches node 0.
  std::string LocalAddress() const { return client_->LocalAddress(); }

  // Another node's failure, naming it ("" while there is none). Asks the store at most every
  // 200 ms unless `now`.
  std::string RemoteFailure(bool now = false);
  // Tells every node that this one failed with `what`; returns the failure that stands (another
  // node's, when one was recorded first, as the likelier cause).
  std::string ReportFailure(const std::string& what);
  // Tells the other nodes why this one stops (when no failure is recorded yet).
  void Announce(const std::string& what);
  // A clean end: says goodbye; node 0 then waits for every node's goodbye, since the store must
  // outlive their last use of it.
  absl::Status Finish();

 private:
  using Clock = std::chrono::steady_clock;
  NodeLink() = default;
  // "node 2, node 3": the nodes that never registered.
  std::string MissingNodes() const;

  const LaunchOptions* options_ = nullptr;
  std::string name_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  Clock::time_point next_poll_, joined_by_;
  bool all_joined_ = false;
};

}  // namespace ithaca
