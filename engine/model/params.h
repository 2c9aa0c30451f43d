// Parameter layout: the model's weights grouped into units (embedding, each block, final norm +
// LM head), each unit one flat buffer. FSDP shards and gathers whole units; safetensors I/O maps
// each Hugging Face tensor name to its slice of a unit.
#pragma once

#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/model/config.h"

namespace ithaca {

struct ParamEntry {
  std::string hf_name;  // e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;
  int64_t offset;        // elements from the start of the unit
  bool is_matrix;        // weight decay applies to matrices only (not to norm weights or biases)
  bool is_bias = false;  // initialized to 0 (norm weights to 1)
};

struct ParamUnit {
  std::string name;  // "embed", "layer.3", "head", "lora.3"
  std::vector<ParamEntry> entries;
  int64_t numel = 0;
  // Trained: it has a gradient and optimizer state. With LoRA only the adapters' units are.
  bool trainable = true;
};

// Indices of the entries inside a block unit, in order. The family's extra attention parameters
// follow: q/k/v biases (kBq, kBk, kBv) when cfg.qkv_bias, then the q/k norms' weights when
// cfg.qk_norm (at kBq and kBq + 1 when there are no biases); BlockEntryIndex finds them.
enum BlockParam { kAttnNorm, kWq, kWk, kWv, kWo, kMlpNorm, kWGate, kWUp, kWDown, kNumBlockParams };
enum ExtraBlockParam { kBq, kBk, kBv, kQNorm, kKNorm };
// The index of an extra entry in a block unit, or -1 when the config has none.
int BlockEntryIndex(const LlamaConfig& cfg, ExtraBlockParam p);
// Entries of the head unit: final norm, then lm_head (absent when embeddings are tied).
enum HeadParam { kFinalNorm, kLmHead };

class ParamLayout {
 public:
  explicit ParamLayout(const LlamaConfig& cfg);
  const std::vector<ParamUnit>& units() const { return units_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  // Unit indices.
  int embed_unit() const { return 0; }
  int block_unit(int layer) const { return 1 + layer; }
  int head_unit() const { return 1 + layers_; }
  // With LoRA (LlamaConfig::lora), block l's adapters are a unit of their own after the head:
  // for each target in LoraTarget order, lora_A [rank, in] then lora_B [out, rank], named as the
  // base model's module ("model.layers.3.self_attn.q_proj.lora_A.weight"); -1 without LoRA.
  bool has_lora() const { return lora_entry_[kLoraQ] != -2; }
  int lora_unit(int layer) const { return has_lora() ? 2 + layers_ + layer : -1; }
  // The index of `target`'s lora_A entry in a LoRA unit (lora_B is the next), or -1 when the
  // target has no adapter.
  int lora_entry(int target) const { return has_lora() ? lora_entry_[target] : -1; }
  int64_t total_numel() const;
  // Elements of the trainable units (every unit without LoRA).
  int64_t trainable_numel() const;

  // A view of one entry inside a unit's flat tensor (which may live on any device).
  static Tensor View(const Tensor& unit_flat, const ParamEntry& e) {
    return unit_flat.Slice(e.offset, e.shape);
  }

 private:
  std::vector<ParamUnit> units_;
  int layers_ = 0;
  int lora_entry_[kNumLoraTargets] = {-2};  // -2 in [0]: no LoRA
};

}  // namespace ithaca
