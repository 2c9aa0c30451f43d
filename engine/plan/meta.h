// The "meta device": an Ops that computes nothing, an allocator that hands out addresses without
// memory, and a Comm that moves nothing. Running the real training schedule on them replays every
// allocation the schedule makes, in order and at full size, in microseconds: that is how the
// planner predicts per-tier peaks without a GPU, and why it cannot drift from the code.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backend/ops.h"
#include "engine/comm/comm.h"
#include "engine/memory/allocator.h"
#include "engine/comm/link_model.h"
#include "engine/plan/step_time.h"

namespace ithaca {

class MetaOps final : public Ops {
 public:
  explicit MetaOps(Device device, DType act) : device_(device), act_(act) {}
  // Each op from now on also advances `clock` by its predicted time from `rates` (step_time.h),
  // on the stream the engine runs it on. Both outlive the ops; nullptr: untimed.
  void set_timing(const RateTable* rates, StepClock* clock) {
    rates_ = rates;
    clock_ = clock;
    gemm_seconds_.clear();
    op_rates_ = {};
  }
  // Every GEMM shape from now on is added to `log` (bench/calibrate measures them).
  void set_gemm_log(std::set<GemmShape>* log) { gemm_log_ = log; }
  Device device() const override { return device_; }
  DType act_dtype() const override { return act_; }
  double PeakFlops() const override { return 0; }
  void Fill(const Tensor& x, float) override;
  void Copy(const Tensor& src, const Tensor& dst) override;
  void Copy2D(const Tensor& src, int64_t, const Tensor&, int64_t, int64_t rows,
              int64_t cols) override;
  Fence CopyAsync(const Tensor& src, const Tensor& dst) override;
  Fence CopyAsyncUnordered(const Tensor& src, const Tensor& dst) override;
  void WaitFence(Fence fence) override;
  void Upload(const void*, DType, const Tensor& dst) override;
  void Download(const Tensor& src, void* host, DType host_dtype) override;
  void Axpy(float, const Tensor&, const Tensor& y) override;
  double SumSquares(const Tensor& x) override;
  double Sum(const Tensor& x) override;
  void SumSquaresInto(const Tensor& x, const Tensor&) override;
  void SumInto(const Tensor& x, const Tensor&) override;
  void Gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, float,
            float) override;
  void GemmBias(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor&, const Tensor& c,
                float, float) override;
  void Embedding(const Tensor& ids, const Tensor&, const Tensor& out) override;
  void EmbeddingBackward(const Tensor& ids, const Tensor& dout, const Tensor&) override;
  void RmsNorm(const Tensor& x, const Tensor&, float, const Tensor& out, const Tensor&) override;
  void RmsNormBackward(const Tensor& x, const Tensor&, const Tensor&, const Tensor& dout,
                       const Tensor& dx, const Tensor&) override;
  void RmsNormBackwardInPlace(const Tensor& x, const Tensor&, float, const Tensor& grad,
                              const Tensor&) override;
  void Rope(const Tensor& x, int64_t, const Tensor&, bool, const DocumentMask&) override;
  void Attention(const Tensor& q, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 const DocumentMask& docs) override;
  void AttentionBackward(const Tensor& q, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const DocumentMask& docs) override;
  void AttentionChunk(const Tensor& q, const Tensor& k, const Tensor&, const Tensor&, const Tensor&,
                      const DocumentMask& docs, int64_t q_pos0, int64_t k_pos0) override;
  void AttentionChunkBackward(const Tensor& q, const Tensor& k, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const DocumentMask& docs, int64_t q_pos0,
                              int64_t k_pos0) override;
  void AttentionMerge(const Tensor& acc, const Tensor&, const Tensor&, const Tensor&) override;
  void SwiGLU(const Tensor& gate, const Tensor&, const Tensor&) override;
  void SwiGLUBackward(const Tensor& gate, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) override;
  void CrossEntropy(const Tensor& logits, const Tensor&, const Tensor&, const Tensor&,
                    float) override;
  // Reads the logits once, like the loss.
  void LabelIsArgmax(const Tensor& logits, const Tensor&, const Tensor&) override {
    Elementwise(ElementwiseOp::kCrossEntropy, static_cast<int64_t>(logits.bytes()));
  }
  void AdamW(const Tensor& master, const Tensor& grad, const Tensor&, const Tensor&,
             const Tensor& working, const AdamWParams&) override;

 private:
  void Elementwise(ElementwiseOp op, int64_t bytes);
  Fence Transfer(const Tensor& src, const Tensor& dst, bool unordered);

  Device device_;
  DType act_;
  const RateTable* rates_ = nullptr;
  StepClock* clock_ = nullptr;
  std::set<GemmShape>* gemm_log_ = nullptr;
  // GemmSeconds by shape: a step issues tens of thousands of GEMMs of a few dozen shapes (at
  // millions of tokens, millions of them), and each lookup scans the table.
  std::unordered_map<GemmShape, double, GemmShape::Hash> gemm_seconds_;
  // Each elementwise op's rate, looked up in the table's map once (set_timing clears them).
  std::array<std::optional<OpRate>, static_cast<size_t>(ElementwiseOp::kNumOps)> op_rates_;
};

// Addresses from a private range, never backed by memory; tracks tiers like a real allocator.
// How long a replay may run and whether to stop it: its caller's (a daemon stops planning when
// the client goes, and bounds its CPU per plan).
class FitMemo;  // engine/plan/planner.h

struct PlanLimits {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;  // unset: never
  // The search (PlanJob) stops at the first configuration that fits, trying the most frugal
  // first, and predicts no step time: whether a job fits at all (`ithaca plan --max-seq-len`
  // asks it at every length it tries), not its fastest plan.
  bool first_fit = false;
  // With first_fit: what earlier plans of the same job at other lengths learned (a
  // configuration that did not fit at some length does not fit at any longer one).
  FitMemo* fit_memo = nullptr;
};

class MetaAllocator final : public Allocator {
 public:
  explicit MetaAllocator(Device device, PlanLimits limits = {})
      : device_(device), limits_(std::move(limits)) {}
  Device device() const override { return device_; }
  absl::StatusOr<void*> Allocate(size_t bytes, Tier tier) override;
  void Free(void* ptr, size_t bytes, Tier tier) override;
  // Every allocation and free from now on is also added to `record` (nullptr: none).
  void set_record(MetaRecord* record) { record_ = record; }
  // What the CUDA caching allocator would hold from the device after the same requests.
  int64_t device_reserved() const { return device_cache_.reserved(); }
  // Whether `p` was handed out for a host tier (the timed replay prices a copy by direction).
  static bool IsHost(const void* p) { return reinterpret_cast<uintptr_t>(p) >= kHostBase; }

 private:
  Device device_;
  PlanLimits limits_;
  int64_t allocations_ = 0;  // the limits are looked at every 256th
  static constexpr uintptr_t kHostBase = uintptr_t{1} << 46;
  uintptr_t next_ = uintptr_t{1} << 44;  // device tiers
  uintptr_t next_host_ = kHostBase;
  SizeClassCache device_cache_;
  MetaRecord* record_ = nullptr;
};

// A communicator of `size` ranks seen from `rank`: collectives move nothing. With timing, each
// one occupies the step clock's comm stream for the link model's time for this group
// (CollectiveSeconds), ordered with the compute stream as NcclComm orders it: a blocking
// collective makes later compute wait; an issued one, only its Wait.
class MetaComm final : public Comm {
 public:
  MetaComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllGather(const Tensor&, const Tensor& out) override;
  absl::Status ReduceScatter(const Tensor& in, const Tensor&) override;
  absl::Status AllToAll(const Tensor& in, const Tensor&) override;
  absl::Status AllReduce(const Tensor& x) override;
  absl::Status Broadcast(const Tensor& x, int) override;
  absl::Status Barrier() override;
  // NVLink or the NIC as SendRecvAcrossNodes says (a shift around the group at its slowest
  // hop); a copy to itself takes no link time.
  absl::Status SendRecv(const Tensor& send, int dst, const Tensor&, int src) override;
  absl::StatusOr<Issued> IssueAllGather(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueReduceScatter(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueAllToAll(const Tensor& in, const Tensor& out) override;
  absl::StatusOr<Issued> IssueSendRecv(const Tensor& send, int dst, const Tensor&,
                                       int src) override;
  // The groups set_splits gives, in order (the last repeats), rank 0's view of each.
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override;
  // The groups this communicator's splits make, in the order they are made: `size` ranks whose
  // members are `stride` apart in this one (the trainer's sequence-parallel groups: consecutive
  // ranks; a ring across Ulysses groups of u: stride u), so a strided group has fewer members
  // per node. The default: groups of one.
  struct GroupOfSplit {
    int size = 1, stride = 1;
  };
  void set_splits(std::vector<GroupOfSplit> splits) { splits_ = std::move(splits); }
  // Collectives from now on (and the groups Split makes) take the link model's time for ranks
  // placed `ranks_per_node` to a node on `clock`. Both outlive this communicator.
  void set_timing(const LinkModel* link, int ranks_per_node, StepClock* clock) {
    link_ = link;
    ranks_per_node_ = ranks_per_node;
    clock_ = clock;
  }

 protected:
  absl::Status WaitIssued(int64_t id) override;

 private:
  uint64_t Charge(CollectiveOp op, int64_t bytes, bool deferred);
  uint64_t ChargeSendRecv(int64_t bytes, int dst, int src, bool deferred);

  int rank_, size_;
  std::vector<GroupOfSplit> splits_;
  size_t splits_made_ = 0;
  const LinkModel* link_ = nullptr;
  int ranks_per_node_ = 1;
  StepClock* clock_ = nullptr;
};

}  // namespace ithaca
