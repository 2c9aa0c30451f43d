// Test helper shared by the config tests: two LlamaConfigs describe the same model, field by
// field (gtest failures name the field).
#pragma once

#include <gtest/gtest.h>

#include "engine/model/config.h"

namespace ithaca {

inline void ExpectSameConfig(const LlamaConfig& a, const LlamaConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.window_first_layer, b.window_first_layer);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.rope.head_dim, b.rope.head_dim);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(RopeTypeName(a.rope.type), RopeTypeName(b.rope.type));
  if (a.rope.type == b.rope.type && a.rope.type != RopeType::kDefault) {
    EXPECT_EQ(a.rope.factor, b.rope.factor);
  }
  if (a.rope.type == RopeType::kLlama3 && b.rope.type == RopeType::kLlama3) {
    EXPECT_EQ(a.rope.low_freq_factor, b.rope.low_freq_factor);
    EXPECT_EQ(a.rope.high_freq_factor, b.rope.high_freq_factor);
    EXPECT_EQ(a.rope.original_max_position, b.rope.original_max_position);
  }
  if (a.rope.type == RopeType::kYarn && b.rope.type == RopeType::kYarn) {
    EXPECT_EQ(a.rope.attention_factor, b.rope.attention_factor);
    EXPECT_EQ(a.rope.beta_fast, b.rope.beta_fast);
    EXPECT_EQ(a.rope.beta_slow, b.rope.beta_slow);
    EXPECT_EQ(a.rope.original_max_position, b.rope.original_max_position);
    EXPECT_EQ(a.rope.truncate, b.rope.truncate);
  }
}

}  // namespace ithaca
