#include <cmath>

#include "engine/backend/ops.h"

namespace ithaca {

// Mirrors transformers' _compute_default_rope_parameters and _compute_llama3_parameters, in
// float32 as they are computed there, so positions rotate by bit-identical angles.
std::vector<float> RopeInverseFrequencies(const RopeConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(cfg.head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(cfg.theta), exponent);
  }
  if (!cfg.llama3_scaling) return inv;
  const double low_freq_wavelen = cfg.original_max_position / cfg.low_freq_factor;
  const double high_freq_wavelen = cfg.original_max_position / cfg.high_freq_factor;
  for (int i = 0; i < half; ++i) {
    const double wavelen = 2.0 * M_PI / inv[i];
    if (wavelen > low_freq_wavelen) {
      inv[i] = static_cast<float>(inv[i] / cfg.factor);
    } else if (wavelen >= high_freq_wavelen) {
      // Medium frequencies: interpolate between scaled and unscaled.
      const double smooth = (cfg.original_max_position / wavelen - cfg.low_freq_factor) /
                            (cfg.high_freq_factor - cfg.low_freq_factor);
      inv[i] = static_cast<float>((1.0 - smooth) * inv[i] / cfg.factor + smooth * inv[i]);
    }
  }
  return inv;
}

}  // namespace ithaca
