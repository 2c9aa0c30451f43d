// The Optimizer's state saved into, and resumed from, a training checkpoint with every rank of a
// job at once: engine/checkpoint/distributed_checkpoint.h (which knows nothing of the optimizer)
// with the Optimizer as what is saved and what the load goes into.
#pragma once

#include <memory>
#include <string>

#include "engine/checkpoint/distributed_checkpoint.h"
#include "engine/comm/comm.h"
#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"
#include "engine/train/optimizer.h"

namespace ithaca {

// SaveCheckpointTogether with `optimizer`'s state (Optimizer::SaveEach): collective, as there.
absl::StatusOr<CheckpointSaveReport> SaveCheckpointTogether(const std::string& dir,
                                                            LlamaModel* model,
                                                            const Optimizer& optimizer,
                                                            const TrainState& state, Comm* comm,
                                                            int64_t keep);

// What a resuming job does (collective): LoadCheckpointTogether with each unit's slices going
// straight into a new optimizer (Optimizer::ResumeEach), so a rank's host holds one unit's
// slices at a time. `loaded` is the load's report; its optimizer slices stay empty.
// `host_state`: the optimizer keeps its state on the host (memory.optimizer_offload), and the
// slices are copied straight into it, whichever way the checkpoint was saved. `frozen`: the
// weights of the units a checkpoint does not hold (LoRA's base; Optimizer::ResumeEach).
struct ResumedCheckpoint {
  std::unique_ptr<Optimizer> optimizer;
  LoadedCheckpoint loaded;
};
absl::StatusOr<ResumedCheckpoint> ResumeCheckpointTogether(
    const std::string& path, LlamaModel* model, Comm* comm, const JobSpec::Training& hp,
    bool host_state = false, const Optimizer::UnitFill& frozen = nullptr);

}  // namespace ithaca
