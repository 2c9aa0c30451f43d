// LlamaConfig: the model's shape, read from / written to a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend/ops.h"
#include "engine/core/status.h"

namespace ithaca {

struct LlamaConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // config.json may omit it: hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  double rope_theta = 500000.0;
  RopeConfig rope;  // head_dim, theta and rope_scaling (type "llama3") folded in
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 8192;
  // Special tokens, written to config.json when >= 0 (-1: absent). A list of eos ids (Llama 3.1+
  // instruct) keeps its first.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  // Number of parameters (embedding, LM head when untied, norms, all layers).
  int64_t NumParameters() const;
  // Parameters of one transformer block.
  int64_t LayerParameters() const;
};

// Checks the invariants the engine relies on (positive sizes, heads divide, head_dim even, ...).
// Bounds on an untrusted config.json, checked before any size is computed from it.
inline constexpr int64_t kMaxConfigSize = int64_t{1} << 26;  // any single dimension
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr double kMaxParameters = 2e12;
absl::Status ValidateConfig(const LlamaConfig& cfg);

// Parses config.json text; errors name the offending key ("config.json: num_key_value_heads ...").
absl::StatusOr<LlamaConfig> ParseConfigJson(const std::string& json_text);
absl::StatusOr<LlamaConfig> LoadConfigJson(const std::string& path);
// Serializes in Hugging Face's layout (model_type "llama", architectures LlamaForCausalLM), so
// transformers loads the directory.
std::string ConfigToJson(const LlamaConfig& cfg);

// Presets: "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b", "tiny" (a few layers, GQA, rope_scaling,
// tied embeddings, byte-level vocabulary: the demo and test model).
absl::StatusOr<LlamaConfig> PresetConfig(const std::string& name);
// The names PresetConfig knows, in the order docs and errors list them.
const std::vector<std::string>& PresetNames();

}  // namespace ithaca
