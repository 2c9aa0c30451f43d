// AdamW on each rank's parameter shards with f32 master weights (optimizer tier), global
// gradient-norm clipping (an all-reduce of the shards' squared norms under FSDP), and decoupled
// weight decay on matrices only (not on norm weights).
//
// With host state (memory.optimizer_offload) the master weights and Adam m and v live in pinned
// host memory (host_optimizer tier) and the CPU AdamW (host_adamw.h) updates them: unit by unit,
// in the order the next forward needs them, in pieces of at most kHostStageElements, a piece of
// the gradient shard goes down to a host staging buffer on the copy stream (the next piece's
// download overlapping this piece's update), the CPU updates it and writes the working copy into
// a second staging buffer, which goes up on the copy stream while the CPU updates the next
// piece (the host waits for one download at a time, Ops::HostWaitFence); the compute stream
// waits for the uploads before anything reads the working copy. Two pieces' staging in all
// (192 MiB with a bf16 working copy). The gradient norm (and so clipping) is
// that of the whole gradient, as on the device: the trainer reads it before the update. Same
// formula, same bits: the weights are those of the on-device optimizer exactly.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/checkpoint/optimizer_state.h"
#include "engine/memory/allocator.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"
#include "engine/train/host_adamw.h"

namespace ithaca {

class Optimizer {
 public:
  // The initial weights of one unit, whole, as f32 (from a file, a random init, a checkpoint).
  using UnitSource = std::function<absl::StatusOr<std::vector<float>>(int unit)>;

  // Takes this rank's shard of every unit as its master weights and writes the model's working
  // copy from them. `host_state`: the state lives on the host and the CPU updates it (above).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(LlamaModel* model,
                                                           const UnitSource& init,
                                                           const JobSpec::Training& hp,
                                                           bool host_state = false);
  // The same from a source that writes a whole unit's f32 weights into `out` (unit_numel
  // floats): with host state and whole units (no FSDP) straight into the master weights, so
  // the start-up allocates, zeroes and copies no second copy of them.
  using UnitFill = std::function<absl::Status(int unit, float* out)>;
  static absl::StatusOr<std::unique_ptr<Optimizer>> CreateFilled(LlamaModel* model,
                                                                 const UnitFill& fill,
                                                                 const JobSpec::Training& hp,
                                                                 bool host_state = false);
  bool host_state() const { return host_state_; }
  ~Optimizer();
  // Host state: the CPU update of a step runs under the next forward, unit by unit as it reads
  // them (ParamStore's before_use hook), instead of before Step returns (see the class comment).
  // Off by default; the trainer sets memory.overlap_update.
  void set_overlap_update(bool on);
  // Finishes an update still in progress (before anything reads the whole state).
  absl::Status FinishUpdate();
  // The CPU time of the last update finished since the previous call, and how much of it the
  // device surely waited for (the first unit's, which nothing queued hides, and any finished
  // outside a forward). Zeros when none finished.
  struct UpdateTimes {
    double cpu_seconds = 0, device_wait_seconds = 0;
  };
  UpdateTimes TakeUpdateTimes();
  // Where Create / Resume spent their time (the start-up line, Trainer::Create): allocating the
  // state (with host state: pinning it, cudaHostAlloc, and zeroing it on every core), producing
  // the initial weights (reading or drawing them, or reading the checkpoint's slices), placing
  // them into the master shards, and writing the working copy from them.
  struct StartupTimes {
    double allocate_s = 0, init_s = 0, place_s = 0, working_copy_s = 0;
    int64_t host_bytes = 0;  // what Allocate pinned
  };
  const StartupTimes& startup() const { return startup_; }
  // Host state's pieces of this many elements instead of kHostStageElements (0: back to it), for
  // optimizers made from now on: tests cut small models into many pieces with it.
  static void SetHostStageElementsForTesting(int64_t n);

  struct StepResult {
    double grad_norm = 0;  // before clipping
    double clip_scale = 1;
    // With host state: the CPU AdamW's own time, and the step's time from the first gradient
    // download to the last upload enqueued, all of which the device waits (it has nothing else
    // to run until the next forward). 0 on the device.
    double cpu_update_seconds = 0;
    double device_wait_seconds = 0;
  };
  // Σ g² of this rank's shard of every unit's gradient, written into `sumsq` (f32 [num_units],
  // on the device) without a host wait. The global Σ g² is the sum of these over every rank
  // when the gradients are sharded (ParamStore::sharded()), else over this rank's alone: the
  // caller all-reduces them (with whatever else the step reports) and reads them once.
  absl::Status GradSumSquares(const Tensor& sumsq);
  // One update from the accumulated gradient shards, at learning rate `lr` (`step` is 1-based),
  // clipped by the global gradient norm √grad_sumsq. Only enqueues work.
  StepResult Step(int64_t step, double lr, double grad_sumsq);
  // The same, computing the global Σ g² first: the host waits for the gradients.
  absl::StatusOr<StepResult> Step(int64_t step, double lr);

  // The state on the host as checkpoints hold it (engine/checkpoint/optimizer_state.h): whole
  // tensors by Hugging Face name, and the names of the tensors to keep, per kind.
  using State = OptimizerState;
  using Selection = OptimizerSelection;
  // Every rank calls it together: each unit is all-gathered on the device in turn (under FSDP),
  // and this rank downloads only the tensors `keep` names, handing each to `sink` as it arrives:
  // the host holds one unit's kept tensors of one kind at a time (a checkpoint writes them
  // straight to its files). `kind` is "master", "m" or "v". The first error of `sink` stops the
  // download but not the gathers (collective: the other ranks go on), and is returned.
  using TensorSink = OptimizerTensorSink;
  absl::Status SaveEach(const Selection& keep, const TensorSink& sink) const;
  // Every master weight, whole, per unit (collective, as SaveEach).
  absl::StatusOr<HostWeights> GatherMasterWeights() const;

  // This rank's slice of every unit's state, as it keeps it (OptimizerShards): what a rank reads
  // from a checkpoint to resume.
  using Shards = OptimizerShards;
  // Takes the slices as the optimizer's state (no collective) and writes the model's working
  // copy from them.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Resume(LlamaModel* model, const Shards& shards,
                                                           const JobSpec::Training& hp,
                                                           bool host_state = false);
  // One unit's slices (master, m, v), as Resume takes them, handed over one unit at a time.
  using UnitSink = OptimizerUnitSink;
  // Resume with the state arriving piecewise: `load(sink)` hands every unit's slices to `sink`
  // (LoadCheckpointTogether does, as it reads them), each uploaded at once, so the host holds
  // one unit's slices at a time. DATA_LOSS names a unit that is misshapen or never came.
  using UnitLoader = std::function<absl::Status(const UnitSink& sink)>;
  // `frozen` writes the weights of each frozen unit (LoRA's base), which a checkpoint does not
  // hold, into the model's working copy (required when the model has frozen units).
  static absl::StatusOr<std::unique_ptr<Optimizer>> ResumeEach(LlamaModel* model,
                                                               const UnitLoader& load,
                                                               const JobSpec::Training& hp,
                                                               bool host_state = false,
                                                               const UnitFill& frozen = nullptr);

 private:
  Optimizer(LlamaModel* model, const JobSpec::Training& hp, bool host_state)
      : model_(model), hp_(hp), host_state_(host_state) {}
  // Allocates the zeroed master, m and v shards (and with host state the staging buffers and
  // the CPU's threads).
  absl::Status Allocate();
  // The update's parameters but weight decay (which follows each entry's kind).
  AdamWParams Params(int64_t step, double lr, double clip_scale) const;
  // Host state: the per-unit pipeline of the class comment, run to its end, or (overlap_update)
  // left pending for the next forward.
  void HostStep(const AdamWParams& base, StepResult* r);
  // The pending update's pieces up to `until` (exclusive) done; returns the last transfer issued.
  Ops::Fence Advance(size_t until) const;
  // The before_use hook: unit `unit` updated; the transfer the compute waits for before using it.
  absl::StatusOr<Ops::Fence> EnsureUnit(int unit);
  // Runs a pending update to its end, the compute waiting for its last transfer.
  void Drain() const;
  // A shard of host state as a device tensor (a copy, comm tier) for the collectives that need
  // device memory; `keep` owns it.
  absl::StatusOr<Tensor> OnDevice(const Buffer& host, Buffer* keep) const;
  void RefreshWorkingCopy();
  // A frozen unit's working copy (LoRA's base, which has no master weights) from its whole f32
  // weights: this rank's slice, uploaded, or converted in place on the host (param_offload).
  void PlaceFrozen(int u, const float* whole);
  // Resume's upload of every unit's slices (DATA_LOSS naming a missing unit).
  absl::Status Restore(const Shards& shards);
  // Uploads unit u's slices into the master, m and v shards (DATA_LOSS naming a wrong size).
  absl::Status RestoreUnit(size_t u, const std::vector<float>& master, const std::vector<float>& m,
                           const std::vector<float>& v);

  LlamaModel* model_;
  JobSpec::Training hp_;
  bool host_state_ = false;
  std::vector<Buffer> master_, m_, v_;
  // Host state only: two pieces' gradient (f32) and working-copy (act dtype) staging, and the
  // CPU's threads.
  Buffer grad_stage_[2], working_stage_[2];
  std::unique_ptr<HostThreadPool> pool_;
  StartupTimes startup_;
  // A host-state update in progress (overlap_update): its pieces, in the forward's order, how
  // many downloads were issued and pieces done, each unit's last transfer.
  struct Piece {
    int unit;
    int64_t lo, hi;  // shard-relative
  };
  struct Pending {
    AdamWParams base;
    std::vector<Piece> pieces;
    std::vector<size_t> unit_end;  // one past each unit's last piece
    std::vector<Ops::Fence> down, unit_fence;
    Ops::Fence last;
    size_t issued = 0, done = 0;
    double cpu = 0, exposed = 0;
    bool first_done = false;
  };
  bool overlap_update_ = false;
  // Mutable: SaveEach and GatherMasterWeights (const) finish an update first.
  mutable std::unique_ptr<Pending> pending_;
  mutable Ops::Fence finished_fence_;
  mutable UpdateTimes last_update_;
};

}  // namespace ithaca
