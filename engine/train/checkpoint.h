// Training checkpoints: DIR/step-00000012/ holding model/ (Hugging Face config.json + f32 master
// weights, loadable by transformers), optimizer.safetensors (Adam m and v under the weights'
// names) and state.json (step, data position). A checkpoint is written under a temporary name
// and renamed into place, so a crash never leaves a partial checkpoint that looks complete.
#pragma once

#include <string>

#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/train/optimizer.h"

namespace ithaca {

struct TrainState {
  int64_t step = 0;           // optimizer steps completed
  int64_t data_position = 0;  // samples served by the data loader
  int64_t tokens = 0;         // tokens trained on
};

absl::Status SaveCheckpoint(const std::string& dir, const LlamaConfig& cfg,
                            const ParamLayout& layout, const Optimizer::State& opt,
                            const TrainState& state, int64_t keep);

// The newest complete checkpoint under `dir` (NOT_FOUND when there is none).
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir);

struct LoadedCheckpoint {
  Optimizer::State optimizer;
  TrainState state;
};
// Errors name the file and what is wrong (corrupt, truncated, a tensor missing or misshapen).
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path, const ParamLayout& layout);

}  // namespace ithaca
