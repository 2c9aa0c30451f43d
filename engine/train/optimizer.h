// AdamW over the model's units with f32 master weights (optimizer tier), global gradient-norm
// clipping, and decoupled weight decay on matrices only (not on norm weights).
#pragma once

#include <memory>
#include <vector>

#include "engine/memory/allocator.h"
#include "engine/model/llama.h"
#include "engine/model/weights.h"
#include "engine/train/job_spec.h"

namespace ithaca {

class Optimizer {
 public:
  // Uploads `init` as the master weights and writes the model's working copy from them.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(LlamaModel* model,
                                                           const HostWeights& init,
                                                           const JobSpec::Training& hp);

  struct StepResult {
    double grad_norm = 0;  // before clipping
    double clip_scale = 1;
  };
  // One update from the model's accumulated gradients, at learning rate `lr`; `step` is 1-based.
  StepResult Step(int64_t step, double lr);

  // State for checkpoints: per unit, f32 host copies of master, m and v.
  struct State {
    HostWeights master, m, v;
  };
  State Save() const;
  absl::Status Restore(const State& state);

 private:
  Optimizer(LlamaModel* model, const JobSpec::Training& hp) : model_(model), hp_(hp) {}
  void RefreshWorkingCopy();

  LlamaModel* model_;
  JobSpec::Training hp_;
  std::vector<Buffer> master_, m_, v_;
};

}  // namespace ithaca
