// The rotary embedding's configuration (RopeConfig) and its inverse frequencies: what a model's
// config.json says of RoPE (engine/model/config.h) and what the Rope op is given
// (engine/backend/ops.h), in a header of its own so that the model's config needs nothing else
// of the backend.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/enum_names.h"

namespace ithaca {

// Rotary embedding frequencies as transformers computes them for a rope_type: "default"
// (theta only), "linear" (every frequency divided by factor), "llama3" (Llama 3.1's banded
// smoothing) or "yarn" (YaRN's ramp between interpolated and extrapolated frequencies, and an
// attention factor that scales cos and sin, i.e. every rotated q and k).
enum class RopeType { kDefault, kLinear, kLlama3, kYarn };
// Each RopeType's name, as config.json's rope_type spells it.
inline constexpr EnumName<RopeType> kRopeTypeNames[] = {
    {RopeType::kDefault, "default"},
    {RopeType::kLinear, "linear"},
    {RopeType::kLlama3, "llama3"},
    {RopeType::kYarn, "yarn"},
};
inline const char* RopeTypeName(RopeType t) { return NameOf(kRopeTypeNames, t); }

struct RopeConfig {
  int head_dim = 64;
  double theta = 500000.0;
  RopeType type = RopeType::kDefault;
  double factor = 8.0;  // linear, llama3, yarn
  // llama3.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;  // llama3, yarn
  // yarn: the attention factor already resolved (explicit, or from factor / mscale as
  // transformers infers it), the ramp's rotation bounds, and whether its ends are rounded.
  double attention_factor = 1.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // What rotated q and k are multiplied by (transformers' attention_scaling): 1 but for yarn.
  double AttentionScaling() const { return type == RopeType::kYarn ? attention_factor : 1.0; }
};

// inv_freq[i] for i in [0, head_dim/2), exactly as Hugging Face computes it (in float32).
std::vector<float> RopeInverseFrequencies(const RopeConfig& cfg);

}  // namespace ithaca
