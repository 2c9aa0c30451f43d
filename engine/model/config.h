// LlamaConfig: the model's shape, read from / written to a Hugging Face config.json. Llama and
// the families that differ from it only in the attention: Qwen2 / Qwen2.5 (biases on q, k and
// v), Qwen3 (per-head RMSNorm of q and k before RoPE) and Mistral (an optional sliding window).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend/rope_config.h"
#include "engine/core/status.h"

namespace ithaca {

// config.json's model_type.
enum class ModelFamily { kLlama, kQwen2, kQwen3, kMistral };
const char* ModelTypeName(ModelFamily f);  // "llama", "qwen2", "qwen3", "mistral"

// LoRA adapters on a frozen base (the spec's [lora]): each targeted linear computes
// y = W x + (alpha / rank) · B A x with A [rank, in] and B [out, rank] trained in f32 and the
// base's weights W (and every other base weight) frozen. Targets are Hugging Face's module names.
enum LoraTarget { kLoraQ, kLoraK, kLoraV, kLoraO, kLoraGate, kLoraUp, kLoraDown, kNumLoraTargets };
// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
const char* LoraTargetName(int target);
// The module's path inside a block: "self_attn.q_proj", "mlp.down_proj".
const char* LoraModulePath(int target);
// The target named `name` ("q_proj"), or -1.
int LoraTargetOf(const std::string& name);
struct LoraConfig {
  int64_t rank = 0;  // 0: no adapters, every weight trained
  double alpha = 0;
  bool targets[kNumLoraTargets] = {};
  bool enabled() const { return rank > 0; }
  float scale() const { return static_cast<float>(alpha / static_cast<double>(rank)); }
};
// The names of the targets `lora` has, in LoraTarget order (PEFT's target_modules).
std::vector<std::string> LoraTargetNames(const LoraConfig& lora);

struct LlamaConfig {
  ModelFamily family = ModelFamily::kLlama;
  // What the family changes, spelled out for the code that builds the model (ValidateConfig
  // checks each agrees with `family`).
  bool qkv_bias = false;  // q_proj, k_proj, v_proj carry biases (Qwen2); o_proj never
  bool qk_norm = false;   // q_norm, k_norm: RMSNorm of each head over head_dim (Qwen3)
  // A sliding window: each query of a windowed layer sees its last W keys, itself included;
  // 0: every layer full causal. Mistral's window is on every layer; Qwen2/Qwen3's
  // (use_sliding_window true) on the layers from max_window_layers on.
  int64_t sliding_window = 0;
  int64_t window_first_layer = 0;  // the first windowed layer (0 for Mistral)
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // config.json may omit it: hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  double rope_theta = 500000.0;
  RopeConfig rope;  // head_dim, theta and rope_scaling (linear, llama3, yarn) folded in
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 8192;
  // Special tokens, written to config.json when >= 0 (-1: absent). A list of eos ids (Llama 3.1+
  // instruct) keeps its first.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  // Adapters from the job's [lora] (never read from or written to config.json).
  LoraConfig lora;

  // Layer l's window (0: full causal).
  int64_t LayerWindow(int64_t l) const {
    return sliding_window > 0 && l >= window_first_layer ? sliding_window : 0;
  }
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
// Serializes in Hugging Face's layout for the family (model_type and architectures
// LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or MistralForCausalLM), so transformers
// loads the directory as the same model.
std::string ConfigToJson(const LlamaConfig& cfg);

// The rotary embedding in words, for plan, status and errors: "rope_theta 500000, llama3 factor
// 32, low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192".
std::string DescribeModelRope(const LlamaConfig& cfg);
// The same rotary embedding: theta, type and every parameter the type reads.
bool SameModelRope(const LlamaConfig& a, const LlamaConfig& b);
// YaRN's attention factor when a config gives neither it nor mscale: 0.1 ln(factor) + 1
// (1 for factor <= 1), as transformers infers it.
double YarnDefaultAttentionFactor(double factor);

// Presets, with the shapes of the configs published on the Hugging Face hub: llama-3.2-1b,
// llama-3.2-3b, llama-3-8b; qwen3-0.6b, -1.7b, -4b, -8b, -14b, -32b; qwen2.5-0.5b, -1.5b, -3b,
// -7b, -14b, -32b; mistral-7b-v0.3; and "tiny" (a few layers, GQA, rope_scaling, tied embeddings,
// byte-level vocabulary: the demo and test model). Names are case-insensitive.
absl::StatusOr<LlamaConfig> PresetConfig(const std::string& name);
// Every preset name PresetConfig accepts, in a stable order (the job spec's model.preset list).
const std::vector<std::string>& PresetNames();

}  // namespace ithaca
