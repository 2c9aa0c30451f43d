// The optimizer's state as checkpoints hold it on the host: f32 master weights, Adam m and Adam
// v, by Hugging Face parameter name or as each rank's slices of the units, and the sinks that hand
// it over piece by piece. engine/train's Optimizer produces and takes these (Optimizer::State,
// ::Selection, ::Shards, ::TensorSink and ::UnitSink name them), and the checkpoint files
// (checkpoint.h) are written from and read into them, so a checkpoint needs no optimizer.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/weights.h"

namespace ithaca {

// Host f32 copies of tensors of the whole-model state, by Hugging Face parameter name
// ("model.layers.3.mlp.up_proj.weight"): master weights, Adam m and Adam v (one process holding
// a whole state: tests, tools; WriteCheckpointShard takes it).
struct OptimizerState {
  std::map<std::string, std::vector<float>> master, m, v;
};

// Names of the tensors to keep, per kind.
struct OptimizerSelection {
  std::set<std::string> master, m, v;
};

// One tensor of the state as it arrives (Optimizer::SaveEach): `kind` is "master", "m" or "v".
using OptimizerTensorSink = std::function<absl::Status(const char* kind, const std::string& name,
                                                       std::vector<float>&& values)>;

// This rank's slice of every unit's state, as it keeps it: elements [shard_begin,
// shard_begin + shard_numel) of each unit (ParamStore), zeros past the unit's end. What a rank
// reads from a checkpoint to resume.
struct OptimizerShards {
  HostWeights master, m, v;
};

// One unit's slices (master, m, v), as Optimizer::Resume takes them, handed over one unit at a
// time.
using OptimizerUnitSink = std::function<absl::Status(
    int unit, std::vector<float>&& master, std::vector<float>&& m, std::vector<float>&& v)>;

}  // namespace ithaca
