#include "engine/model/params.h"

#include "absl/strings/str_cat.h"

namespace ithaca {
namespace {

void AddEntry(ParamUnit& unit, std::string name, Shape shape, bool is_bias = false) {
  const bool is_matrix = shape.size() == 2;
  const int64_t n = NumElements(shape);
  unit.entries.push_back({std::move(name), std::move(shape), unit.numel, is_matrix, is_bias});
  unit.numel += n;
}

}  // namespace

int BlockEntryIndex(const LlamaConfig& cfg, ExtraBlockParam p) {
  const int biases = cfg.qkv_bias ? 3 : 0;
  switch (p) {
    case kBq:
    case kBk:
    case kBv:
      return cfg.qkv_bias ? kNumBlockParams + static_cast<int>(p) : -1;
    case kQNorm:
    case kKNorm:
      return cfg.qk_norm ? kNumBlockParams + biases + (p == kQNorm ? 0 : 1) : -1;
  }
  return -1;
}

ParamLayout::ParamLayout(const LlamaConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;
  ParamUnit embed{"embed", {}, 0};
  AddEntry(embed, "model.embed_tokens.weight", {c.vocab_size, d});
  units_.push_back(std::move(embed));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    ParamUnit u{absl::StrCat("layer.", l), {}, 0};
    // Order must match BlockParam.
    AddEntry(u, p + "input_layernorm.weight", {d});
    AddEntry(u, p + "self_attn.q_proj.weight", {c.num_attention_heads * hd, d});
    AddEntry(u, p + "self_attn.k_proj.weight", {c.num_key_value_heads * hd, d});
    AddEntry(u, p + "self_attn.v_proj.weight", {c.num_key_value_heads * hd, d});
    AddEntry(u, p + "self_attn.o_proj.weight", {d, c.num_attention_heads * hd});
    AddEntry(u, p + "post_attention_layernorm.weight", {d});
    AddEntry(u, p + "mlp.gate_proj.weight", {f, d});
    AddEntry(u, p + "mlp.up_proj.weight", {f, d});
    AddEntry(u, p + "mlp.down_proj.weight", {d, f});
    if (c.qkv_bias) {
      AddEntry(u, p + "self_attn.q_proj.bias", {c.num_attention_heads * hd}, /*is_bias=*/true);
      AddEntry(u, p + "self_attn.k_proj.bias", {c.num_key_value_heads * hd}, /*is_bias=*/true);
      AddEntry(u, p + "self_attn.v_proj.bias", {c.num_key_value_heads * hd}, /*is_bias=*/true);
    }
    if (c.qk_norm) {
      AddEntry(u, p + "self_attn.q_norm.weight", {hd});
      AddEntry(u, p + "self_attn.k_norm.weight", {hd});
    }
    units_.push_back(std::move(u));
  }
  ParamUnit head{"head", {}, 0};
  AddEntry(head, "model.norm.weight", {d});
  if (!c.tie_word_embeddings) AddEntry(head, "lm_head.weight", {c.vocab_size, d});
  units_.push_back(std::move(head));
  layers_ = static_cast<int>(c.num_hidden_layers);
  if (!c.lora.enabled()) return;
  for (ParamUnit& u : units_) u.trainable = false;  // the base is frozen
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  // in, out of each target's linear.
  const int64_t dims[kNumLoraTargets][2] = {{d, q}, {d, kv}, {d, kv}, {q, d},
                                            {d, f}, {d, f},  {f, d}};
  const int64_t r = c.lora.rank;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    ParamUnit u{absl::StrCat("lora.", l), {}, 0};
    for (int t = 0; t < kNumLoraTargets; ++t) {
      lora_entry_[t] = -1;
      if (!c.lora.targets[t]) continue;
      lora_entry_[t] = static_cast<int>(u.entries.size());
      const std::string m = absl::StrCat("model.layers.", l, ".", LoraModulePath(t));
      AddEntry(u, m + ".lora_A.weight", {r, dims[t][0]});
      AddEntry(u, m + ".lora_B.weight", {dims[t][1], r});
    }
    units_.push_back(std::move(u));
  }
}

int64_t ParamLayout::trainable_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.trainable ? u.numel : 0;
  return n;
}

int64_t ParamLayout::total_numel() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.numel;
  return n;
}

}  // namespace ithaca
