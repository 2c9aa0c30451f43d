// AdamW on each rank's parameter shards with f32 master weights (optimizer tier), global
// gradient-norm clipping (an all-reduce of the shards' squared norms under FSDP), and decoupled
// weight decay on matrices only (not on norm weights).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/memory/allocator.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

class Optimizer {
 public:
  // The initial weights of one unit, whole, as f32 (from a file, a random init, a checkpoint).
  using UnitSource = std::function<absl::StatusOr<std::vector<float>>(int unit)>;

  // Takes this rank's shard of every unit as its master weights and writes the model's working
  // copy from them.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(LlamaModel* model,
                                                           const UnitSource& init,
                                                           const JobSpec::Training& hp);

  struct StepResult {
    double grad_norm = 0;  // before clipping
    double clip_scale = 1;
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

  // Whole-model state as f32 host copies per unit (gathered from every rank's shards; every rank
  // must call Save together).
  struct State {
    HostWeights master, m, v;
  };
  absl::StatusOr<State> Save() const;
  absl::Status Restore(const State& state);

 private:
  Optimizer(LlamaModel* model, const JobSpec::Training& hp) : model_(model), hp_(hp) {}
  void RefreshWorkingCopy();

  LlamaModel* model_;
  JobSpec::Training hp_;
  std::vector<Buffer> master_, m_, v_;
};

}  // namespace ithaca
