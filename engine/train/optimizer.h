// AdamW on each rank's parameter shards with f32 master weights (optimizer tier), global
// gradient-norm clipping (an all-reduce of the shards' squared norms under FSDP), and decoupled
// weight decay on matrices only (not on norm weights).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
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

  // Host f32 copies of tensors of the whole-model state, by Hugging Face parameter name
  // ("model.layers.3.mlp.up_proj.weight"): master weights, Adam m and Adam v (one process
  // holding a whole state: tests, tools; WriteCheckpointShard takes it).
  struct State {
    std::map<std::string, std::vector<float>> master, m, v;
  };
  // Names of the tensors to keep, per kind.
  struct Selection {
    std::set<std::string> master, m, v;
  };
  // Every rank calls it together: each unit is all-gathered on the device in turn (under FSDP),
  // and this rank downloads only the tensors `keep` names, handing each to `sink` as it arrives:
  // the host holds one unit's kept tensors of one kind at a time (a checkpoint writes them
  // straight to its files). `kind` is "master", "m" or "v". The first error of `sink` stops the
  // download but not the gathers (collective: the other ranks go on), and is returned.
  using TensorSink = std::function<absl::Status(const char* kind, const std::string& name,
                                                std::vector<float>&& values)>;
  absl::Status SaveEach(const Selection& keep, const TensorSink& sink) const;
  // Every master weight, whole, per unit (collective, as SaveEach).
  absl::StatusOr<HostWeights> GatherMasterWeights() const;

  // This rank's slice of every unit's state, as it keeps it: elements [shard_begin,
  // shard_begin + shard_numel) of each unit (ParamStore), zeros past the unit's end. What a
  // rank reads from a checkpoint to resume.
  struct Shards {
    HostWeights master, m, v;
  };
  // Takes the slices as the optimizer's state (no collective) and writes the model's working
  // copy from them.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Resume(LlamaModel* model, const Shards& shards,
                                                           const JobSpec::Training& hp);
  // One unit's slices (master, m, v), as Resume takes them, handed over one unit at a time.
  using UnitSink = std::function<absl::Status(int unit, std::vector<float>&& master,
                                              std::vector<float>&& m, std::vector<float>&& v)>;
  // Resume with the state arriving piecewise: `load(sink)` hands every unit's slices to `sink`
  // (LoadCheckpointTogether does, as it reads them), each uploaded at once, so the host holds
  // one unit's slices at a time. DATA_LOSS names a unit that is misshapen or never came.
  using UnitLoader = std::function<absl::Status(const UnitSink& sink)>;
  static absl::StatusOr<std::unique_ptr<Optimizer>> ResumeEach(LlamaModel* model,
                                                               const UnitLoader& load,
                                                               const JobSpec::Training& hp);

 private:
  Optimizer(LlamaModel* model, const JobSpec::Training& hp) : model_(model), hp_(hp) {}
  // Allocates the zeroed master, m and v shards.
  absl::Status Allocate();
  void RefreshWorkingCopy();
  // Resume's upload of every unit's slices (DATA_LOSS naming a missing unit).
  absl::Status Restore(const Shards& shards);
  // Uploads unit u's slices into the master, m and v shards (DATA_LOSS naming a wrong size).
  absl::Status RestoreUnit(size_t u, const std::vector<float>& master, const std::vector<float>& m,
                           const std::vector<float>& v);

  LlamaModel* model_;
  JobSpec::Training hp_;
  std::vector<Buffer> master_, m_, v_;
};

}  // namespace ithaca
