#include <algorithm>
#include <cmath>

#include "engine/backend/rope_config.h"

namespace ithaca {

namespace {

// YaRN's correction dimension: the (fractional) frequency index that makes `rotations` turns
// over `max_positions` positions.
double YarnCorrectionDim(double rotations, int dim, double base, double max_positions) {
  return dim * std::log(max_positions / (rotations * 2 * M_PI)) / (2 * std::log(base));
}

}  // namespace

// Mirrors transformers' _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters and _compute_yarn_parameters, in float32 where they compute in
// float32, so positions rotate by bit-identical angles.
std::vector<float> RopeInverseFrequencies(const RopeConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    float exponent = static_cast<float>(2 * i) / static_cast<float>(cfg.head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(cfg.theta), exponent);
  }
  switch (cfg.type) {
    case RopeType::kDefault:
      return inv;
    case RopeType::kLinear:
      for (float& f : inv) f /= static_cast<float>(cfg.factor);
      return inv;
    case RopeType::kYarn: {
      // pos_freqs = base^(2i/dim); extrapolation 1/pos_freqs, interpolation 1/(factor·pos_freqs);
      // a linear ramp over [low, high] (frequency indices) blends them.
      double low = YarnCorrectionDim(cfg.beta_fast, cfg.head_dim, cfg.theta,
                                     static_cast<double>(cfg.original_max_position));
      double high = YarnCorrectionDim(cfg.beta_slow, cfg.head_dim, cfg.theta,
                                      static_cast<double>(cfg.original_max_position));
      if (cfg.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, static_cast<double>(cfg.head_dim - 1));
      if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
      const float lo = static_cast<float>(low), span = static_cast<float>(high - low);
      for (int i = 0; i < half; ++i) {
        const float pos_freq =
            std::pow(static_cast<float>(cfg.theta),
                     static_cast<float>(2 * i) / static_cast<float>(cfg.head_dim));
        const float extrapolation = 1.0f / pos_freq;
        const float interpolation = 1.0f / (static_cast<float>(cfg.factor) * pos_freq);
        const float ramp = std::clamp((static_cast<float>(i) - lo) / span, 0.0f, 1.0f);
        const float extrapolation_factor = 1.0f - ramp;
        inv[i] =
            interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
      }
      return inv;
    }
    case RopeType::kLlama3:
      break;
  }
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
