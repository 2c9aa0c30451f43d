// ParamStore: where each rank keeps the model's parameter units and their gradients.
//
// With FSDP (ZeRO-3) every unit is one flat buffer cut into `world` equal shards (the last padded
// with zeros): a rank keeps its shard of the working copy (params tier) and of the gradient
// (grads tier); Acquire all-gathers the full unit into a params-tier buffer just before use and
// Release frees it; AcquireGrad hands out a zeroed full-size f32 gradient buffer and ReduceGrad
// reduce-scatters (sums) it into the rank's gradient shard and frees it. Without FSDP every rank
// keeps whole units, gradients accumulate in place, and FinishGradients all-reduces them.
//
// With overlap (the default) communication runs under compute: Gather starts a unit's
// all-gather without waiting for it (the schedule gathers the next block's unit before running
// this block, and waits at Gathered, when it first reads it), and ReduceGrad leaves the
// reduce-scatter in flight, finishing it (adding the summed slice into the gradient shard and
// freeing the full-size buffer) only at the next ReduceGrad or FlushGradients. That keeps one
// more full-size f32 gradient buffer alive while the next block's backward runs: the memory
// plan replays this code, so it counts it.
//
// With host parameters (memory.param_offload) the working-copy shards live in pinned host memory
// (host_params tier) and the device holds a unit only while it is held: Gather uploads the
// rank's shard on the copy stream (CopyAsync) into a params-tier buffer, and under FSDP then
// all-gathers it from there (the compute stream waits for the shard's upload first, a 1/world
// of the unit); Gathered makes the compute wait for the upload; the last Release frees it. The
// schedule starts the next unit's lease before running this one (overlap), so the upload runs
// under this unit's compute: the device holds two units of weights, the used and the next.
// Nothing else changes: gradients and their reductions are the device's, as without it.
//
// A unit's state may be owed by an update still in progress (optimizer offload's CPU update of
// the last step, run unit by unit under the next forward: engine/train/optimizer.h): the
// `before_use` hook is called with the unit before its working copy is first read (Gather, and
// Gathered without FSDP) and before its gradient shard is zeroed, and returns the transfer the
// compute must wait for first. ZeroGrads only marks the gradients stale; each unit's is zeroed
// when the backward first writes it (AcquireGrad, or the reduction into it), after the hook.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/ops.h"
#include "engine/comm/comm.h"
#include "engine/memory/allocator.h"
#include "engine/model/params.h"

namespace ithaca {

class ParamStore {
 public:
  // `world` may be nullptr (one rank).
  static absl::StatusOr<std::unique_ptr<ParamStore>> Create(const ParamLayout& layout, Ops* ops,
                                                            Allocator* alloc, Comm* world,
                                                            bool fsdp, bool host_params = false);

  bool sharded() const { return sharded_; }
  // The working-copy shards are host memory (memory.param_offload): write them on the host.
  bool host_params() const { return host_params_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  // This rank's slice of a unit: elements [shard_begin, shard_begin + shard_numel) of the unit
  // (the slice may run into the zero padding past the unit's end).
  int64_t shard_numel(int unit) const { return units_[unit].shard; }
  int64_t shard_begin(int unit) const { return sharded_ ? rank_ * units_[unit].shard : 0; }
  int64_t unit_numel(int unit) const { return units_[unit].numel; }
  const Tensor& working_shard(int unit) const { return units_[unit].working.tensor(); }
  // Empty for a frozen unit (ParamUnit::trainable false), which has no gradient.
  const Tensor& grad_shard(int unit) const { return units_[unit].grad.tensor(); }
  bool trainable(int unit) const { return !units_[unit].grad.empty(); }

  // Holds the unit gathered: starts its all-gather (issue-now) unless it is held already. Calls
  // nest: the unit is gathered once and freed at the last Release.
  absl::Status Gather(int unit);
  // The full unit (act dtype) of a unit this caller holds (Gather), once its gather is done.
  absl::StatusOr<Tensor> Gathered(int unit);
  // Gather, then Gathered.
  absl::StatusOr<Tensor> Acquire(int unit);
  void Release(int unit);
  // A full-size f32 gradient buffer for the unit (zeroed under FSDP).
  absl::StatusOr<Tensor> AcquireGrad(int unit);
  // Adds the gradient buffer into this rank's gradient shard (reduce-scatter under FSDP; with
  // overlap, finished at the next ReduceGrad or FlushGradients).
  absl::Status ReduceGrad(int unit);
  // Finishes every reduce-scatter in flight: after it the gradient shards are complete.
  absl::Status FlushGradients();
  // After the last micro-step: flushes, and without FSDP all-reduces every unit's gradient.
  absl::Status FinishGradients();
  void ZeroGrads();

  // Called before a unit's working copy is read or its gradient shard zeroed (above); returns
  // the transfer the compute waits for before either. nullptr: none.
  using UnitHook = std::function<absl::StatusOr<Ops::Fence>(int unit)>;
  void set_before_use(UnitHook hook) { before_use_ = std::move(hook); }
  // Tests: each unit's first read of the working copy per lease ("use U"), and whatever else
  // the hook's owner logs ("update U"), in order.
  void set_trace(std::function<void(const std::string&)> trace) { trace_ = std::move(trace); }
  void Trace(const std::string& event) const {
    if (trace_) trace_(event);
  }
  // The whole unit on the host as f32, from a shard-shaped tensor of any rank-local state
  // (working copy, gradient, master, Adam moments): all-gathered under FSDP. Every rank calls it.
  absl::StatusOr<std::vector<float>> GatherToHost(int unit, const Tensor& shard);
  // Only parts of the whole unit, each element range [first, second) into its own host vector:
  // the unit is still gathered on the device (transiently), but the host receives only what the
  // caller keeps. Every rank calls it, also one that wants no range.
  absl::StatusOr<std::vector<std::vector<float>>> GatherRangesToHost(
      int unit, const Tensor& shard, const std::vector<std::pair<int64_t, int64_t>>& ranges);
  // Every rank's shard of a whole host unit (zero padded), uploaded into `shard`.
  void ScatterFromHost(int unit, const std::vector<float>& whole, const Tensor& shard);
  Comm* world() const { return world_; }
  // Off: every collective completes before compute goes on (the reference schedule).
  void set_overlap(bool on) { overlap_ = on; }

 private:
  struct Unit {
    int64_t numel = 0, shard = 0;
    Buffer working, grad;  // shards (or whole units without FSDP)
    Buffer gathered, full_grad;
    Issued gathering;  // the all-gather into `gathered`, until Gathered waits for it
    // Host parameters: the shard's upload (into `gathered`, or into `staged` under FSDP).
    Buffer staged;
    Ops::Fence upload;
    bool stale_grad = false;  // ZeroGrads was called: zero before the next write
    int users = 0;
  };
  // A gradient reduce-scatter in flight: `part` receives the unit's summed slice.
  struct Reduction {
    int unit;
    Buffer full, part;
    Issued reduce_scatter;
  };
  absl::Status Finish(Reduction& r);
  // The before_use hook, with the compute waiting for its transfer.
  absl::Status BeforeUse(int unit);
  // Zeroes the unit's gradient shard if ZeroGrads left it stale.
  absl::Status FreshGrad(int unit);
  ParamStore(Ops* ops, Allocator* alloc, Comm* world) : ops_(ops), alloc_(alloc), world_(world) {}

  Ops* ops_;
  Allocator* alloc_;
  Comm* world_;
  bool sharded_ = false;
  bool overlap_ = true;
  bool host_params_ = false;
  int rank_ = 0;
  std::vector<Unit> units_;
  std::vector<Reduction> reducing_;  // oldest first; at most one with overlap
  UnitHook before_use_;
  std::function<void(const std::string&)> trace_;
};

}  // namespace ithaca
