// GlooComm: Comm over Gloo's TCP transport (Debian's libgloo-dev), for the CPU backend and CI.
//
// Ranks meet through a rendezvous directory ("file:/abs/dir", Gloo's FileStore); sub-groups from
// Split rendezvous under their own key prefix in the same directory and share this process's
// transport device. Reductions are done as all-to-all + a local sum over ranks 0, 1, ..., P-1,
// so every rank gets bit-identical results that do not depend on the algorithm or the timing.
// Gloo reports failures as C++ exceptions; none escapes this class: every one becomes an
// absl::Status naming this rank and, when it can be known, the peer. After the first error the
// communicator is closed (its peers then fail fast instead of waiting out their timeouts) and
// every later call returns that error. Like every Comm, one thread at a time per communicator.
//
// The Issue* forms run on a background thread of the communicator's own, in issue order, so a
// CPU rank computes while its collectives move data (the same overlap NCCL gives on a GPU, and
// the same hazards: the CPU tests catch a schedule that reads a result before waiting for it).
// Every blocking call first waits for the issued ones to finish, so Gloo still sees one
// collective at a time, in the same order on every rank.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/comm.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace ithaca {

struct GlooOptions {
  // Address this rank listens on for its peers: loopback for one node; the node's address (or a
  // name resolving to it) when ranks span machines.
  std::string hostname = "127.0.0.1";
  // Bound on connecting and on every collective: a peer that is dead or stuck yields an error
  // (UNAVAILABLE or DEADLINE_EXCEEDED) within this many seconds.
  double timeout_s = 60;
  // Tests only: each issued collective (Issue*) starts this many milliseconds late on the
  // background thread. A schedule that reads an issued collective's output before waiting, or
  // writes its input while it may still be in flight (hazards a GPU's comm stream would hit at
  // random), then gets wrong numbers every time instead of rarely.
  int issue_delay_ms = 0;
};

class GlooComm final : public Comm {
 public:
  // Joins the `world` ranks that meet at `rendezvous`. Blocks until all have joined (or the
  // timeout passes). The directory must be fresh for each job: keys from an earlier run make
  // the connection fail.
  static absl::StatusOr<std::unique_ptr<GlooComm>> Create(int rank, int world,
                                                          const std::string& rendezvous,
                                                          const GlooOptions& options = {});
  ~GlooComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Pure data movement works on any dtype (f32, bf16, i32); reductions sum f32, i32 (wrapping)
  // and bf16 (accumulated in f32, rounded once).
  absl::Status AllGather(const Tensor& in, const Tensor& out) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override;
  absl::Status AllReduce(const Tensor& x) override;
  absl::Status Broadcast(const Tensor& x, int root) override;
  absl::Status Barrier() override;
  // Only the ranks of the exchange take part (the others' collectives are not disturbed); a
  // failure names dst and src.
  absl::Status SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) override;
  absl::StatusOr<Issued> IssueAllGather(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueAllToAll(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                       int src) override;
  // Colors must be >= 0 on every rank. A group of one rank is a SelfComm.
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override;

  // OK, or the first error this communicator hit (it is then unusable).
  absl::Status health() {
    Drain();
    return broken_;
  }
  // The ranks of the communicator Create made (the "global" ranks) that form this one, in order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }

 protected:
  absl::Status WaitIssued(int64_t id) override;

 private:
  struct Background;  // the thread that runs issued collectives
  struct Shared;      // the store and transport device, shared by a communicator and its splits
  struct PeerInfo;    // who each peer is, for error messages

  GlooComm(std::shared_ptr<Shared> shared, std::shared_ptr<gloo::Context> context, int rank,
           int size, std::string prefix, std::vector<int> global_ranks);

  // Connects a context of `size` ranks under `prefix` of the store.
  static absl::StatusOr<std::shared_ptr<gloo::Context>> Connect(const Shared& shared, int rank,
                                                                int size,
                                                                const std::string& prefix);
  // Runs `fn` (which calls Gloo), turning any exception into an error status for `op`. An error
  // blames only the ranks in `involved` (empty: any peer; SendRecv names its two).
  template <typename Fn>
  absl::Status Run(const char* op, Fn&& fn, const std::vector<int>& involved = {});
  absl::Status Fail(const char* op, const std::string& what, double elapsed_s,
                    const std::vector<int>& involved);
  std::string DescribePeers(const std::string& gloo_message,
                            const std::vector<int>& involved) const;
  absl::Status ExchangePeerInfo();
  std::string Name() const;           // "gloo rank 1 of 4", for messages
  std::string RankName(int r) const;  // "rank 1", or "rank 1 (global rank 5)" in a split
  uint32_t NextTag() { return next_tag_++; }
  // Queues `collective` (a blocking call on this communicator) for the background thread.
  absl::StatusOr<Issued> Defer(std::function<absl::Status()> collective);
  // Returns once the background thread has run every queued collective (at once on that thread).
  void Drain();
  // Grow-only scratch buffers (the CPU backend has no memory tiers for them to belong to).
  uint8_t* Scratch(int which, size_t bytes);
  // The byte-level collectives behind the public ones.
  void RawAllToAll(const void* in, void* out, size_t bytes);
  void RawAllGather(const void* in, void* out, size_t in_bytes);

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int size_;
  std::string prefix_;
  std::vector<int> global_ranks_;
  std::vector<PeerInfo> peers_;
  uint32_t next_tag_ = 1;
  // Point-to-point messages sent to / received from each rank so far: SendRecv's slots count
  // them per pair, not with next_tag_, since ranks outside an exchange do not call it.
  std::vector<uint64_t> sent_, received_;
  int splits_ = 0;
  absl::Status broken_;
  std::vector<uint8_t> scratch_[3];
  std::unique_ptr<Background> background_;  // started by the first Issue* call
};

}  // namespace ithaca
