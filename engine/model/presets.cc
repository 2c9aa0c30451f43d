// The presets: LlamaConfigs with the shapes of the configs published on the Hugging Face hub,
// and "tiny", the demo and test model (PresetConfig, PresetNames in config.h).
#include "engine/model/config.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ithaca {
namespace {

// One published shape: the fields a hub config.json sets, the rest from the family.
struct Preset {
  const char* name;
  ModelFamily family;
  int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_positions;
  double theta, eps;
  bool tied;
  int64_t bos, eos;
};

// From the config.json files on the Hugging Face hub (Qwen/Qwen3-*, the Qwen/Qwen2.5-* base
// models, mistralai/Mistral-7B-v0.3). Qwen2.5's use_sliding_window is false in every one.
constexpr Preset kPresets[] = {
    {"qwen3-0.6b", ModelFamily::kQwen3, 1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e6, 1e-6, true,
     151643, 151645},
    {"qwen3-1.7b", ModelFamily::kQwen3, 2048, 6144, 28, 16, 8, 128, 151936, 40960, 1e6, 1e-6, true,
     151643, 151645},
    {"qwen3-4b", ModelFamily::kQwen3, 2560, 9728, 36, 32, 8, 128, 151936, 40960, 1e6, 1e-6, true,
     151643, 151645},
    {"qwen3-8b", ModelFamily::kQwen3, 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e6, 1e-6, false,
     151643, 151645},
    {"qwen3-14b", ModelFamily::kQwen3, 5120, 17408, 40, 40, 8, 128, 151936, 40960, 1e6, 1e-6, false,
     151643, 151645},
    {"qwen3-32b", ModelFamily::kQwen3, 5120, 25600, 64, 64, 8, 128, 151936, 40960, 1e6, 1e-6, false,
     151643, 151645},
    {"qwen2.5-0.5b", ModelFamily::kQwen2, 896, 4864, 24, 14, 2, 64, 151936, 32768, 1e6, 1e-6, true,
     151643, 151643},
    {"qwen2.5-1.5b", ModelFamily::kQwen2, 1536, 8960, 28, 12, 2, 128, 151936, 131072, 1e6, 1e-6,
     true, 151643, 151643},
    {"qwen2.5-3b", ModelFamily::kQwen2, 2048, 11008, 36, 16, 2, 128, 151936, 32768, 1e6, 1e-6, true,
     151643, 151643},
    {"qwen2.5-7b", ModelFamily::kQwen2, 3584, 18944, 28, 28, 4, 128, 152064, 131072, 1e6, 1e-6,
     false, 151643, 151643},
    {"qwen2.5-14b", ModelFamily::kQwen2, 5120, 13824, 48, 40, 8, 128, 152064, 131072, 1e6, 1e-5,
     false, 151643, 151643},
    {"qwen2.5-32b", ModelFamily::kQwen2, 5120, 27648, 64, 40, 8, 128, 152064, 131072, 1e6, 1e-5,
     false, 151643, 151643},
    {"mistral-7b-v0.3", ModelFamily::kMistral, 4096, 14336, 32, 32, 8, 128, 32768, 32768, 1e6, 1e-5,
     false, 1, 2},
};

}  // namespace

const std::vector<std::string>& PresetNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = {"tiny", "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b"};
    for (const Preset& p : kPresets) n.push_back(p.name);
    return n;
  }();
  return names;
}

absl::StatusOr<LlamaConfig> PresetConfig(const std::string& name) {
  LlamaConfig c;
  const std::string key = absl::AsciiStrToLower(name);
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets) {
    if (key == p.name) preset = &p;
  }
  if (preset) {
    const Preset& p = *preset;
    c.family = p.family;
    c.qkv_bias = p.family == ModelFamily::kQwen2;
    c.qk_norm = p.family == ModelFamily::kQwen3;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.intermediate;
    c.num_hidden_layers = p.layers;
    c.num_attention_heads = p.heads;
    c.num_key_value_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.vocab_size = p.vocab;
    c.max_position_embeddings = p.max_positions;
    c.rope_theta = p.theta;
    c.rms_norm_eps = p.eps;
    c.tie_word_embeddings = p.tied;
    c.bos_token_id = p.bos;
    c.eos_token_id = p.eos;
  } else if (key == "llama-3.2-1b" || key == "llama-3.2-3b") {
    const bool small = key == "llama-3.2-1b";
    c.hidden_size = small ? 2048 : 3072;
    c.intermediate_size = 8192;
    c.num_hidden_layers = small ? 16 : 28;
    c.num_attention_heads = small ? 32 : 24;
    c.num_key_value_heads = 8;
    c.head_dim = small ? 64 : 128;
    c.vocab_size = 128256;
    c.rope_theta = 500000.0;
    c.rope.type = RopeType::kLlama3;
    c.rope.factor = 32.0;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
    c.rope.original_max_position = 8192;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 131072;
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else if (key == "llama-3-8b") {
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_hidden_layers = 32;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.head_dim = 128;
    c.vocab_size = 128256;
    c.rope_theta = 500000.0;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = false;
    c.max_position_embeddings = 8192;
    c.bos_token_id = 128000;
    c.eos_token_id = 128001;
  } else if (key == "tiny") {
    c.hidden_size = 64;
    c.intermediate_size = 176;
    c.num_hidden_layers = 2;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 16;
    c.vocab_size = 258;  // bytes 0..255, then BOS and EOS
    c.rope_theta = 10000.0;
    c.rope.type = RopeType::kLlama3;
    c.rope.factor = 8.0;
    c.rope.low_freq_factor = 1.0;
    c.rope.high_freq_factor = 4.0;
    c.rope.original_max_position = 64;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 4096;
    c.bos_token_id = 256;
    c.eos_token_id = 257;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model preset \"", name, "\"; valid: ", absl::StrJoin(PresetNames(), ", ")));
  }
  c.rope.head_dim = static_cast<int>(c.head_dim);
  c.rope.theta = c.rope_theta;
  return c;
}

}  // namespace ithaca
