#include "engine/train/optimizer_checkpoint.h"

#include <string>
#include <utility>
#include <vector>

namespace ithaca {

absl::StatusOr<CheckpointSaveReport> SaveCheckpointTogether(const std::string& dir,
                                                            LlamaModel* model,
                                                            const Optimizer& optimizer,
                                                            const TrainState& state, Comm* comm,
                                                            int64_t keep) {
  return SaveCheckpointTogether(
      dir, model,
      [&](const OptimizerSelection& keep_names, const OptimizerTensorSink& sink) {
        return optimizer.SaveEach(keep_names, sink);
      },
      state, comm, keep);
}

absl::StatusOr<ResumedCheckpoint> ResumeCheckpointTogether(const std::string& path,
                                                           LlamaModel* model, Comm* comm,
                                                           const JobSpec::Training& hp,
                                                           bool host_state,
                                                           const Optimizer::UnitFill& frozen) {
  ResumedCheckpoint r;
  ASSIGN_OR_RETURN(r.optimizer, Optimizer::ResumeEach(
                                    model,
                                    [&](const Optimizer::UnitSink& sink) -> absl::Status {
                                      ASSIGN_OR_RETURN(r.loaded, LoadCheckpointTogether(
                                                                     path, model, comm, sink));
                                      return absl::OkStatus();
                                    },
                                    hp, host_state, frozen));
  return r;
}

}  // namespace ithaca
