// RehearsalComm: one rank of an N-rank job, alone on one device. Each collective is a local copy
// of the exact sizes the real one moves, issued where NCCL's would be (the comm stream, ordered
// with the compute stream by events), and then holds that stream for the time the link model
// gives the collective (link_model.h). So one GPU runs a rank's step for real: its buffers,
// its compute and the overlap of compute with communication are those of the job; only the
// values are not (the loss means nothing, as in the memory probe).
//
//   all-gather       fills every slot of `out` from this rank's shard
//   reduce-scatter   keeps this rank's chunk of `in` (no sum)
//   all-to-all       copies `in` to `out`
//   all-reduce       leaves x; broadcast leaves x; barrier only holds
//   send-recv        copies `send` to `recv` (this rank's data stands in for its peer's)
//
// Split makes the sub-communicator the real layout gives: the job's split rule says which color
// and key every rank passes (the Trainer's sequence-parallel groups: UlyssesSplit, trainer.h), so
// the group has the real size, this rank's place in it and the nodes it spans. Such a group splits
// again by the layout's group rules, in the order the model makes its splits (with a ring: the
// Ulysses group, then the ring, upipe.h). A rank passing other arguments than the rule gives it is
// INVALID_ARGUMENT, as is a split no rule covers.
//
// docs/rehearsal.md says what a rehearsal measures and what it models.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/comm/link_model.h"

namespace ithaca {

// What a collective does on the device: the copies, in order, then the hold. One per rank,
// shared by its communicator and the sub-communicators split off it (they share the comm stream,
// as NCCL's do).
class RehearsalDevice {
 public:
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  virtual ~RehearsalDevice() = default;
  virtual Device device() const = 0;
  // Runs `copies` after the work issued so far, then holds until `hold_s` seconds have passed
  // since they began (a collective lasts the longer of its copies and its modeled time).
  // Without `deferred` the work issued afterwards waits for it; with it, only Wait(ticket) makes
  // it wait. Returns the ticket (0: nothing to wait for).
  virtual absl::StatusOr<int64_t> Run(const std::vector<Copy>& copies, double hold_s,
                                      bool deferred) = 0;
  virtual absl::Status Wait(int64_t ticket) = 0;
  // Until everything run so far has completed.
  virtual absl::Status Synchronize() = 0;
  virtual void UseStreams(const DeviceStreams& /*streams*/) {}
};

// The CPU's: memcpy on the caller's thread, no hold (Gloo's collectives are synchronous too; a
// CPU rehearsal checks memory and schedules, not time).
std::shared_ptr<RehearsalDevice> HostRehearsalDevice();

// Every rank's arguments to the job's split (world rank -> color, key).
using SplitRule = std::function<SplitArgs(int world_rank)>;

// The job being rehearsed: `world` ranks on `nodes` nodes, consecutive ranks on a node.
struct RehearsalLayout {
  int world = 1;
  int nodes = 1;
  LinkModel link;
  SplitRule split;  // unset: Split is refused
  // A group's own splits, in the order they are made: each maps a member's rank in the group to
  // the arguments it passes.
  std::vector<SplitRule> group_splits;
};

// Per kind of collective, what one rank's communicators did (world and groups together).
struct RehearsalCounts {
  int64_t calls = 0;
  int64_t bytes = 0;     // payload as CollectiveSeconds counts it
  double modeled_s = 0;  // the link model's time, summed
};
struct RehearsalStats {
  std::array<RehearsalCounts, 7> by_op;  // indexed by CollectiveOp
  double modeled_s() const;
  int64_t calls() const;
};

class RehearsalComm final : public Comm {
 public:
  // Rank `rank` of the layout's world. INVALID_ARGUMENT for a rank outside it or nodes that do
  // not divide the world.
  static absl::StatusOr<std::unique_ptr<RehearsalComm>> Create(
      int rank, const RehearsalLayout& layout, std::shared_ptr<RehearsalDevice> device);

  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(members_.size()); }
  GroupShape shape() const { return shape_; }

  absl::Status AllGather(const Tensor& in, const Tensor& out) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::Status AllToAll(const Tensor& in, const Tensor& out) override;
  absl::Status AllReduce(const Tensor& x) override;
  absl::Status Broadcast(const Tensor& x, int root) override;
  absl::Status Barrier() override;
  // Held for NVLink or the NIC as SendRecvAcrossNodes says (a shift around the group at its
  // slowest hop); a copy to itself holds nothing.
  absl::Status SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) override;
  absl::StatusOr<Issued> IssueAllGather(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueAllToAll(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                       int src) override;
  absl::Status Synchronize() override;
  void UseStreams(const DeviceStreams& streams) override;
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override;

  // Off: collectives are their copies alone (the link model's time is still counted), which
  // measures the step's compute with infinitely fast links. Shared with sub-communicators.
  void set_link_time(bool on);
  // What this rank's communicators did since the last ResetStats.
  RehearsalStats stats() const;
  void ResetStats();

 protected:
  absl::Status WaitIssued(int64_t id) override;

 private:
  struct Shared;  // the layout, the device and the stats, for the world and its groups
  RehearsalComm(std::shared_ptr<Shared> shared, std::vector<int> members, int index, bool is_world);
  // The link model's time for a collective of this group (CollectiveSeconds).
  double GroupSeconds(CollectiveOp op, int64_t bytes) const;
  // Counts the collective (`modeled_s` of link time) and runs its copies on the device.
  absl::StatusOr<int64_t> Run(CollectiveOp op, int64_t bytes, double modeled_s,
                              const std::vector<RehearsalDevice::Copy>& copies, bool deferred);
  absl::StatusOr<Issued> Start(CollectiveOp op, int64_t bytes, double modeled_s,
                               const std::vector<RehearsalDevice::Copy>& copies, bool deferred);

  std::shared_ptr<Shared> shared_;
  std::vector<int> members_;  // world ranks, in this communicator's rank order
  int index_ = 0;             // this rank's place in members_
  bool is_world_ = true;
  int splits_made_ = 0;  // of a group: the next split takes layout.group_splits[splits_made_]
  GroupShape shape_;
};

}  // namespace ithaca
