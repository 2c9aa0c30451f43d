// LlamaConfig's invariants (ValidateConfig) and parameter counts. config.json is read and
// written in config_json.cc and rope_json.cc, the presets are presets.cc.
#include "engine/model/config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/config_json_internal.h"

namespace ithaca {

const char* ModelTypeName(ModelFamily f) { return NameOf(config_internal::kModelTypeNames, f); }

namespace {
constexpr const char* kLoraModules[kNumLoraTargets] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
}  // namespace

const char* LoraModulePath(int target) { return kLoraModules[target]; }

const char* LoraTargetName(int target) {
  const char* path = kLoraModules[target];
  return path + std::string(path).find('.') + 1;
}

int LoraTargetOf(const std::string& name) {
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (name == LoraTargetName(t)) return t;
  }
  return -1;
}

std::vector<std::string> LoraTargetNames(const LoraConfig& lora) {
  std::vector<std::string> names;
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (lora.targets[t]) names.push_back(LoraTargetName(t));
  }
  return names;
}

int64_t LlamaConfig::LayerParameters() const {
  const int64_t d = hidden_size;
  const int64_t q = num_attention_heads * head_dim * d;
  const int64_t kv = num_key_value_heads * head_dim * d;
  const int64_t biases = qkv_bias ? (num_attention_heads + 2 * num_key_value_heads) * head_dim : 0;
  const int64_t qk_norms = qk_norm ? 2 * head_dim : 0;
  return q + 2 * kv + q + 3 * d * intermediate_size + 2 * d + biases + qk_norms;
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t embed = vocab_size * hidden_size;
  return num_hidden_layers * LayerParameters() + embed + hidden_size +
         (tie_word_embeddings ? 0 : embed);
}

absl::Status ValidateConfig(const LlamaConfig& cfg) {
  auto bad = [](const std::string& key, const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": ", problem));
  };
  const std::pair<const char*, int64_t> sizes[] = {
      {"hidden_size", cfg.hidden_size},
      {"intermediate_size", cfg.intermediate_size},
      {"num_hidden_layers", cfg.num_hidden_layers},
      {"num_attention_heads", cfg.num_attention_heads},
      {"num_key_value_heads", cfg.num_key_value_heads},
      {"head_dim", cfg.head_dim},
      {"vocab_size", cfg.vocab_size},
      {"max_position_embeddings", cfg.max_position_embeddings},
  };
  for (const auto& [key, value] : sizes) {
    if (value <= 0) return bad(key, absl::StrCat("must be positive, got ", value));
    // Far above any real Llama, and low enough that no size computed from them overflows: a
    // config.json is untrusted input that reaches the planner inside the daemon.
    // One bound per key, so every message names the same one (layers have their own).
    const int64_t max = std::string(key) == "num_hidden_layers" ? kMaxLayers : kMaxConfigSize;
    if (value > max) return bad(key, absl::StrCat("must be at most ", max, ", got ", value));
  }
  if (cfg.num_attention_heads % cfg.num_key_value_heads != 0) {
    return bad("num_key_value_heads",
               absl::StrCat(cfg.num_key_value_heads, " does not divide num_attention_heads ",
                            cfg.num_attention_heads));
  }
  if (cfg.head_dim % 2 != 0) {
    return bad("head_dim", absl::StrCat("must be even (rotary pairs), got ", cfg.head_dim));
  }
  if (!(cfg.rope_theta > 0) || !std::isfinite(cfg.rope_theta)) {
    return bad("rope_theta", absl::StrCat("must be positive, got ", cfg.rope_theta));
  }
  if (!(cfg.rms_norm_eps > 0) || !std::isfinite(cfg.rms_norm_eps)) {
    return bad("rms_norm_eps", absl::StrCat("must be positive, got ", cfg.rms_norm_eps));
  }
  // A hand-built config must keep its RopeConfig in step with the fields it duplicates.
  if (cfg.rope.head_dim != cfg.head_dim) {
    return bad("rope.head_dim",
               absl::StrCat(cfg.rope.head_dim, " differs from head_dim ", cfg.head_dim));
  }
  if (cfg.rope.theta != cfg.rope_theta) {
    return bad("rope.theta",
               absl::StrCat(cfg.rope.theta, " differs from rope_theta ", cfg.rope_theta));
  }
  // The family's architecture, as ParseConfigJson and the presets set it.
  const bool qwen2 = cfg.family == ModelFamily::kQwen2, qwen3 = cfg.family == ModelFamily::kQwen3;
  if (cfg.qkv_bias != qwen2) {
    return bad("qkv_bias", absl::StrCat(cfg.qkv_bias, " does not match model_type ",
                                        ModelTypeName(cfg.family), " (only qwen2 has them)"));
  }
  if (cfg.qk_norm != qwen3) {
    return bad("qk_norm", absl::StrCat(cfg.qk_norm, " does not match model_type ",
                                       ModelTypeName(cfg.family), " (only qwen3 has them)"));
  }
  if (cfg.sliding_window < 0 || cfg.sliding_window > kMaxConfigSize ||
      (cfg.sliding_window > 0 && cfg.family == ModelFamily::kLlama)) {
    return bad("sliding_window",
               absl::StrCat(cfg.sliding_window, " is not a window of model_type ",
                            ModelTypeName(cfg.family), " (mistral, qwen2, qwen3: positive up to ",
                            kMaxConfigSize, ", or 0 for none)"));
  }
  // Mistral windows every layer; Qwen2/Qwen3 from a layer that exists.
  const bool window_layers_ok =
      cfg.family == ModelFamily::kMistral || cfg.sliding_window == 0
          ? cfg.window_first_layer == 0
          : cfg.window_first_layer >= 0 && cfg.window_first_layer < cfg.num_hidden_layers;
  if (!window_layers_ok) {
    return bad(
        "window_first_layer",
        absl::StrCat(cfg.window_first_layer, " with a sliding_window of ", cfg.sliding_window,
                     " in ", cfg.num_hidden_layers, " layers of ", ModelTypeName(cfg.family)));
  }
  // Qwen2's attention derives head_dim from hidden_size (older transformers ignore the key).
  if (qwen2 && cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size) {
    return bad("head_dim", absl::StrCat(cfg.head_dim, " is not hidden_size / num_attention_heads ",
                                        cfg.hidden_size, " / ", cfg.num_attention_heads,
                                        " (qwen2 has no head_dim of its own)"));
  }
  const RopeConfig& r = cfg.rope;
  if (r.type != RopeType::kDefault) {
    if (!(r.factor > 0) || !std::isfinite(r.factor)) {
      return bad("rope_scaling.factor", absl::StrCat("must be positive, got ", r.factor));
    }
    if (r.original_max_position <= 0) {
      return bad("rope_scaling.original_max_position_embeddings",
                 absl::StrCat("must be positive, got ", r.original_max_position));
    }
  }
  if (r.type == RopeType::kYarn) {
    for (const auto& [key, v] :
         {std::pair<const char*, double>{"attention_factor", r.attention_factor},
          {"beta_fast", r.beta_fast},
          {"beta_slow", r.beta_slow}}) {
      if (!(v > 0) || !std::isfinite(v)) {
        return bad(absl::StrCat("rope_scaling.", key), absl::StrCat("must be positive, got ", v));
      }
    }
  }
  if (r.type == RopeType::kLlama3) {
    if (!(r.low_freq_factor > 0) || !std::isfinite(r.low_freq_factor)) {
      return bad("rope_scaling.low_freq_factor",
                 absl::StrCat("must be positive, got ", r.low_freq_factor));
    }
    // The smoothing interpolation divides by their difference.
    if (!(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor)) {
      return bad("rope_scaling.high_freq_factor",
                 absl::StrCat("must exceed low_freq_factor ", r.low_freq_factor, ", got ",
                              r.high_freq_factor));
    }
  }
  // Parameter counts are int64 everywhere, and the planner sizes buffers from them: refuse
  // shapes far beyond any real model before anything overflows or allocates.
  const long double d = cfg.hidden_size, f = cfg.intermediate_size, hd = cfg.head_dim;
  const long double layer =
      (2.0L * cfg.num_attention_heads + 2.0L * cfg.num_key_value_heads) * hd * d + 3.0L * d * f +
      2.0L * d;
  const long double total = cfg.num_hidden_layers * layer + 2.0L * cfg.vocab_size * d + d;
  if (total > kMaxParameters) {
    return bad("hidden_size",
               absl::StrFormat("the model's shape is too large: %.3Lg parameters, at most %.3g",
                               total, kMaxParameters));
  }
  return absl::OkStatus();
}

}  // namespace ithaca
