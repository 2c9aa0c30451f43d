// The published config.json of real Llama models (the hub's dialect: rope_theta + rope_scaling)
// and the same files re-saved by transformers 5 (rope_parameters, theta inside) give identical
// LlamaConfigs, equal to the models' published shapes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "engine/model/config_testing.h"

namespace ithaca {
namespace {

std::string ConfigPath(const std::string& model, const std::string& dialect) {
  return std::string(std::getenv("TEST_SRCDIR")) + "/ithaca/tests/golden/configs/" + model + "." +
         dialect + ".json";
}

// Llama-3.1-8B has no preset: Llama-3-8B's shape with a 128K context through llama3 scaling.
LlamaConfig Llama31_8B() {
  LlamaConfig c = *PresetConfig("llama-3-8b");
  c.max_position_embeddings = 131072;
  c.rope.type = RopeType::kLlama3;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position = 8192;
  return c;
}

TEST(ConfigDialectsTest, BothDialectsGiveThePublishedModel) {
  struct Case {
    const char* model;
    LlamaConfig expected;
  };
  const Case cases[] = {
      {"llama-3.2-1b", *PresetConfig("llama-3.2-1b")},
      {"llama-3.2-3b", *PresetConfig("llama-3.2-3b")},
      {"llama-3-8b", *PresetConfig("llama-3-8b")},
      {"llama-3.1-8b", Llama31_8B()},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model);
    // The re-saved file must really be the other dialect, or this test compares a file with
    // itself.
    auto v5_text = ReadFileToString(ConfigPath(c.model, "transformers5"));
    ASSERT_TRUE(v5_text.ok()) << v5_text.status();
    EXPECT_NE(v5_text->find("\"rope_parameters\""), std::string::npos);
    EXPECT_EQ(v5_text->find("\"rope_scaling\""), std::string::npos);
    EXPECT_EQ(v5_text->find("\n  \"rope_theta\""), std::string::npos);  // only inside

    auto hub = LoadConfigJson(ConfigPath(c.model, "hub"));
    ASSERT_TRUE(hub.ok()) << hub.status();
    auto v5 = LoadConfigJson(ConfigPath(c.model, "transformers5"));
    ASSERT_TRUE(v5.ok()) << v5.status();
    ExpectSameConfig(*hub, *v5);
    ExpectSameConfig(*hub, c.expected);
    EXPECT_EQ(hub->NumParameters(), c.expected.NumParameters());
    EXPECT_EQ(hub->rope_theta, 500000.0);
  }
  // The published parameter count of Llama-3.1-8B (same shape as Llama-3-8B).
  EXPECT_EQ(Llama31_8B().NumParameters(), 8030261248);
}

}  // namespace
}  // namespace ithaca
