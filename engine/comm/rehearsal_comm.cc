#include "engine/comm/rehearsal_comm.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "engine/comm/comm_checks.h"
#include "engine/core/ranks_per_host.h"

namespace ithaca {
namespace {

class HostDevice final : public RehearsalDevice {
 public:
  Device device() const override { return Device::kCpu; }
  absl::StatusOr<int64_t> Run(const std::vector<Copy>& copies, double /*hold_s*/,
                              bool /*deferred*/) override {
    for (const Copy& c : copies) {
      if (c.bytes > 0 && c.dst != c.src) std::memmove(c.dst, c.src, c.bytes);
    }
    return 0;
  }
  absl::Status Wait(int64_t /*ticket*/) override { return absl::OkStatus(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
};

// Byte offset of chunk `i` of `parts` equal chunks of `t`.
char* Chunk(const Tensor& t, int i, int parts) {
  return static_cast<char*>(t.data) + t.bytes() / parts * i;
}

GroupShape ShapeOf(const std::vector<int>& members, int world, int nodes) {
  const int per_node = RanksPerHost(world, nodes);
  std::map<int, int> count;  // node -> members on it
  for (int w : members) ++count[w / per_node];
  GroupShape g;
  g.ranks = static_cast<int>(members.size());
  g.nodes = static_cast<int>(count.size());
  g.ranks_per_node = 0;
  for (const auto& [node, n] : count) g.ranks_per_node = std::max(g.ranks_per_node, n);
  return g;
}

}  // namespace

std::shared_ptr<RehearsalDevice> HostRehearsalDevice() { return std::make_shared<HostDevice>(); }

double RehearsalStats::modeled_s() const {
  double s = 0;
  for (const RehearsalCounts& c : by_op) s += c.modeled_s;
  return s;
}

int64_t RehearsalStats::calls() const {
  int64_t n = 0;
  for (const RehearsalCounts& c : by_op) n += c.calls;
  return n;
}

struct RehearsalComm::Shared {
  RehearsalLayout layout;
  std::shared_ptr<RehearsalDevice> device;
  std::mutex mu;  // guards what follows
  bool link_time = true;
  RehearsalStats stats;
};

absl::StatusOr<std::unique_ptr<RehearsalComm>> RehearsalComm::Create(
    int rank, const RehearsalLayout& layout, std::shared_ptr<RehearsalDevice> device) {
  if (layout.world < 1 || rank < 0 || rank >= layout.world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rehearsal: rank ", rank, " is not a rank of a world of ", layout.world));
  }
  if (layout.nodes < 1 || layout.world % layout.nodes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rehearsal: ", layout.nodes, " nodes do not divide a world of ", layout.world, " ranks"));
  }
  if (device == nullptr) return absl::InvalidArgumentError("rehearsal: no device");
  auto shared = std::make_shared<Shared>();
  shared->layout = layout;
  shared->device = std::move(device);
  std::vector<int> members(layout.world);
  for (int r = 0; r < layout.world; ++r) members[r] = r;
  return std::unique_ptr<RehearsalComm>(
      new RehearsalComm(std::move(shared), std::move(members), rank, /*is_world=*/true));
}

RehearsalComm::RehearsalComm(std::shared_ptr<Shared> shared, std::vector<int> members, int index,
                             bool is_world)
    : shared_(std::move(shared)), members_(std::move(members)), index_(index), is_world_(is_world) {
  shape_ = ShapeOf(members_, shared_->layout.world, shared_->layout.nodes);
}

double RehearsalComm::GroupSeconds(CollectiveOp op, int64_t bytes) const {
  return CollectiveSeconds(shared_->layout.link, op, bytes, shape_);
}

absl::StatusOr<int64_t> RehearsalComm::Run(CollectiveOp op, int64_t bytes, double modeled_s,
                                           const std::vector<RehearsalDevice::Copy>& copies,
                                           bool deferred) {
  bool link_time = true;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    RehearsalCounts& c = shared_->stats.by_op[static_cast<int>(op)];
    ++c.calls;
    c.bytes += bytes;
    c.modeled_s += modeled_s;
    link_time = shared_->link_time;
  }
  return shared_->device->Run(copies, link_time ? modeled_s : 0.0, deferred);
}

absl::StatusOr<Issued> RehearsalComm::Start(CollectiveOp op, int64_t bytes, double modeled_s,
                                            const std::vector<RehearsalDevice::Copy>& copies,
                                            bool deferred) {
  ASSIGN_OR_RETURN(int64_t ticket, Run(op, bytes, modeled_s, copies, deferred));
  if (ticket == 0) return Issued();
  return Issued(this, ticket);
}

absl::StatusOr<Issued> RehearsalComm::IssueAllGather(const Tensor& in, const Tensor& out) {
  const int n = size();
  RETURN_IF_ERROR(CheckAllGather(in, out, index_, n, shared_->device->device()));
  std::vector<RehearsalDevice::Copy> copies;
  for (int j = 0; j < n; ++j) copies.push_back({Chunk(out, j, n), in.data, in.bytes()});
  return Start(CollectiveOp::kAllGather, out.bytes(),
               GroupSeconds(CollectiveOp::kAllGather, out.bytes()), copies, true);
}

absl::StatusOr<Issued> RehearsalComm::IssueReduceScatter(const Tensor& in, const Tensor& out) {
  const int n = size();
  RETURN_IF_ERROR(CheckReduceScatter(in, out, index_, n, shared_->device->device()));
  return Start(CollectiveOp::kReduceScatter, in.bytes(),
               GroupSeconds(CollectiveOp::kReduceScatter, in.bytes()),
               {{out.data, Chunk(in, index_, n), out.bytes()}}, true);
}

absl::StatusOr<Issued> RehearsalComm::IssueAllToAll(const Tensor& in, const Tensor& out) {
  RETURN_IF_ERROR(CheckAllToAll(in, out, size(), shared_->device->device()));
  return Start(CollectiveOp::kAllToAll, in.bytes(),
               GroupSeconds(CollectiveOp::kAllToAll, in.bytes()), {{out.data, in.data, in.bytes()}},
               true);
}

absl::StatusOr<Issued> RehearsalComm::IssueSendRecv(const Tensor& send, int dst, const Tensor& recv,
                                                    int src) {
  RETURN_IF_ERROR(CheckSendRecv(send, dst, recv, src, index_, size(), shared_->device->device()));
  const int per_node = RanksPerHost(shared_->layout.world, shared_->layout.nodes);
  std::vector<int> node_of(members_.size());
  for (size_t m = 0; m < members_.size(); ++m) node_of[m] = members_[m] / per_node;
  const bool self = dst == index_;  // then src == index_ too (checked)
  const bool across = SendRecvAcrossNodes(node_of, index_, dst, src);
  const double modeled_s = self ? 0.0 : SendRecvSeconds(shared_->layout.link, send.bytes(), across);
  return Start(CollectiveOp::kSendRecv, send.bytes(), modeled_s,
               {{recv.data, send.data, send.bytes()}}, true);
}

absl::Status RehearsalComm::AllGather(const Tensor& in, const Tensor& out) {
  ASSIGN_OR_RETURN(Issued issued, IssueAllGather(in, out));
  return issued.Wait();
}

absl::Status RehearsalComm::ReduceScatter(const Tensor& in, const Tensor& out) {
  ASSIGN_OR_RETURN(Issued issued, IssueReduceScatter(in, out));
  return issued.Wait();
}

absl::Status RehearsalComm::AllToAll(const Tensor& in, const Tensor& out) {
  ASSIGN_OR_RETURN(Issued issued, IssueAllToAll(in, out));
  return issued.Wait();
}

absl::Status RehearsalComm::SendRecv(const Tensor& send, int dst, const Tensor& recv, int src) {
  ASSIGN_OR_RETURN(Issued issued, IssueSendRecv(send, dst, recv, src));
  return issued.Wait();
}

absl::Status RehearsalComm::AllReduce(const Tensor& x) {
  RETURN_IF_ERROR(CheckAllReduce(x, shared_->device->device()));
  return Run(CollectiveOp::kAllReduce, x.bytes(), GroupSeconds(CollectiveOp::kAllReduce, x.bytes()),
             {}, false)
      .status();
}

absl::Status RehearsalComm::Broadcast(const Tensor& x, int root) {
  RETURN_IF_ERROR(CheckBroadcast(x, root, size(), shared_->device->device()));
  return Run(CollectiveOp::kBroadcast, x.bytes(), GroupSeconds(CollectiveOp::kBroadcast, x.bytes()),
             {}, false)
      .status();
}

absl::Status RehearsalComm::Barrier() {
  RETURN_IF_ERROR(
      Run(CollectiveOp::kBarrier, 0, GroupSeconds(CollectiveOp::kBarrier, 0), {}, false).status());
  return shared_->device->Synchronize();  // a barrier is a host-side wait, as NcclComm's
}

absl::Status RehearsalComm::Synchronize() { return shared_->device->Synchronize(); }

void RehearsalComm::UseStreams(const DeviceStreams& streams) {
  shared_->device->UseStreams(streams);
}

absl::Status RehearsalComm::WaitIssued(int64_t id) { return shared_->device->Wait(id); }

absl::StatusOr<std::unique_ptr<Comm>> RehearsalComm::Split(int color, int key) {
  const int me = members_[index_];
  if (color < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("split: rank ", me, " passed color ", color, "; colors must be >= 0"));
  }
  // The world splits by the job's rule over world ranks; a group by its next group rule, over
  // its members' ranks in it (the model's splits of its sequence-parallel group).
  const std::vector<SplitRule>& group_rules = shared_->layout.group_splits;
  const bool world_rule = is_world_ && shared_->layout.split;
  if (!world_rule && (is_world_ || splits_made_ >= static_cast<int>(group_rules.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rehearsal: rank ", me, ": no split rule for this communicator's split ", splits_made_ + 1,
        " (the world splits by the job's rule, a group by the layout's group rules)"));
  }
  const SplitRule& rule = world_rule ? shared_->layout.split : group_rules[splits_made_];
  const int n = world_rule ? shared_->layout.world : size();
  const SplitArgs mine = rule(world_rule ? me : index_);
  if (mine.color != color || mine.key != key) {
    return absl::InvalidArgumentError(
        absl::StrCat("rehearsal: rank ", me, " split with color ", color, ", key ", key,
                     " but the job's rule gives it color ", mine.color, ", key ", mine.key));
  }
  if (!is_world_) ++splits_made_;
  // The ranks of this color, ordered by key then rank (as MPI_Comm_split and ncclCommSplit).
  std::vector<std::pair<int, int>> group;  // (key, world rank)
  for (int i = 0; i < n; ++i) {
    const SplitArgs a = rule(i);
    if (a.color == color) group.emplace_back(a.key, world_rule ? i : members_[i]);
  }
  std::sort(group.begin(), group.end());
  std::vector<int> members;
  int index = 0;
  for (const auto& [k, w] : group) {
    if (w == me) index = static_cast<int>(members.size());
    members.push_back(w);
  }
  return std::unique_ptr<Comm>(
      new RehearsalComm(shared_, std::move(members), index, /*is_world=*/false));
}

void RehearsalComm::set_link_time(bool on) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->link_time = on;
}

RehearsalStats RehearsalComm::stats() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->stats;
}

void RehearsalComm::ResetStats() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->stats = RehearsalStats();
}

}  // namespace ithaca
