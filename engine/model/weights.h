// Model weights on the host: random initialization, and Hugging Face checkpoints (config.json +
// safetensors, one file or shards with an index) in and out.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/model/safetensors.h"

namespace ithaca {

// One f32 host vector per unit of the layout.
using HostWeights = std::vector<std::vector<float>>;

// Deterministic in `seed`: matrices ~ N(0, 0.02²) (Hugging Face's initializer_range), norms = 1,
// biases = 0. Each unit has its own counter-based stream (element j's value depends only on
// seed, unit and j), so one unit can be made without the others, and is made on every core.
std::vector<float> RandomUnitWeights(const ParamLayout& layout, int unit, uint64_t seed);
// The same values written into `out` (the unit's numel floats), e.g. straight into host master
// weights: no vector to allocate, zero and copy (32 GB of them for Llama-3-8B).
void RandomUnitWeightsInto(const ParamLayout& layout, int unit, uint64_t seed, float* out);
HostWeights RandomWeights(const ParamLayout& layout, uint64_t seed);

// Reads every tensor the layout names, checking shapes; a tied model ignores lm_head.weight.
absl::StatusOr<std::vector<float>> ReadUnitWeights(const ParamLayout& layout,
                                                   const SafetensorsReader& reader, int unit);
// The same into `out` (the unit's numel floats).
absl::Status ReadUnitWeightsInto(const ParamLayout& layout, const SafetensorsReader& reader,
                                 int unit, float* out);

// Writes `dir`/config.json and the weights (model.safetensors, or shards + index above
// max_shard_bytes) as `file_dtype`, so transformers can load the directory.
absl::Status WriteHfCheckpoint(const std::string& dir, const LlamaConfig& cfg,
                               const ParamLayout& layout, const std::vector<const float*>& units,
                               DType file_dtype, int64_t max_shard_bytes);

}  // namespace ithaca
