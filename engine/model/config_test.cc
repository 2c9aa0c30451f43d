// Tests for LlamaConfig: presets, config.json parsing and writing, validation, parameter counts.
#include "engine/model/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

#include "engine/core/file_util.h"
#include "engine/model/config_testing.h"

namespace ithaca {
namespace {

// Meta's config.json for Llama-3.2-1B, as published on the Hugging Face hub.
constexpr char kLlama32_1B[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Replaces the first occurrence of `from` in `s` (which must be there).
std::string Replace(std::string s, const std::string& from, const std::string& to) {
  size_t pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos != std::string::npos) s.replace(pos, from.size(), to);
  return s;
}

void ExpectInvalid(const std::string& json, std::initializer_list<const char*> needles) {
  auto cfg = ParseConfigJson(json);
  ASSERT_FALSE(cfg.ok()) << "parsed:\n" << json;
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << cfg.status();
  const std::string msg(cfg.status().message());
  for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << n << " in: " << msg;
}

TEST(ConfigTest, PresetsMatchPublishedModels) {
  auto one = PresetConfig("llama-3.2-1b");
  auto three = PresetConfig("llama-3.2-3b");
  auto eight = PresetConfig("llama-3-8b");
  auto tiny = PresetConfig("tiny");
  ASSERT_TRUE(one.ok() && three.ok() && eight.ok() && tiny.ok());
  // The parameter counts Meta and Hugging Face report.
  EXPECT_EQ(one->NumParameters(), 1235814400);
  EXPECT_EQ(three->NumParameters(), 3212749824);
  EXPECT_EQ(eight->NumParameters(), 8030261248);
  EXPECT_EQ(eight->LayerParameters(), 218112000);
  EXPECT_EQ(one->head_dim, 64);
  EXPECT_EQ(three->head_dim, 128);
  EXPECT_TRUE((one->rope.type == RopeType::kLlama3) && (three->rope.type == RopeType::kLlama3));
  EXPECT_EQ(three->rope.factor, 32.0);
  EXPECT_FALSE((eight->rope.type == RopeType::kLlama3));
  EXPECT_FALSE(eight->tie_word_embeddings);
  EXPECT_EQ(eight->max_position_embeddings, 8192);

  // tiny: byte vocabulary plus BOS/EOS, GQA, llama3 scaling, tied.
  EXPECT_EQ(tiny->vocab_size, 258);
  EXPECT_EQ(tiny->bos_token_id, 256);
  EXPECT_EQ(tiny->eos_token_id, 257);
  EXPECT_EQ(tiny->num_attention_heads / tiny->num_key_value_heads, 2);
  EXPECT_EQ(tiny->rope.head_dim, 16);
  EXPECT_EQ(tiny->rope.theta, 10000.0);
  EXPECT_EQ(tiny->rope.original_max_position, 64);
  EXPECT_EQ(tiny->rope.factor, 8.0);
  // 2·(64·64 + 2·32·64 + 64·64 + 3·64·176 + 128) + 258·64 + 64.
  EXPECT_EQ(tiny->LayerParameters(), 4096 + 4096 + 4096 + 33792 + 128);
  EXPECT_EQ(tiny->NumParameters(), 2 * 46208 + 16512 + 64);

  for (const char* name : {"llama-3.2-1b", "llama-3.2-3b", "llama-3-8b", "tiny"}) {
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(ValidateConfig(*c).ok()) << name << ": " << ValidateConfig(*c);
  }
}

TEST(ConfigTest, UnknownPresetListsValidNames) {
  auto c = PresetConfig("llama-2-7b");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* n : {"llama-2-7b", "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b", "tiny"}) {
    EXPECT_NE(c.status().message().find(n), std::string::npos) << n;
  }
}

TEST(ConfigTest, PresetsRoundTripThroughJson) {
  for (const char* name : {"llama-3.2-1b", "llama-3.2-3b", "llama-3-8b", "tiny"}) {
    SCOPED_TRACE(name);
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok());
    const std::string json = ConfigToJson(*c);
    auto back = ParseConfigJson(json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    ExpectSameConfig(*c, *back);
    // Hugging Face's layout: what transformers needs to build a LlamaForCausalLM.
    for (const char* key :
         {"\"architectures\": [\n    \"LlamaForCausalLM\"\n  ]", "\"model_type\": \"llama\"",
          "\"torch_dtype\": \"bfloat16\"", "\"hidden_act\": \"silu\"", "\"attention_bias\": false",
          "\"mlp_bias\": false"}) {
      EXPECT_NE(json.find(key), std::string::npos) << key << " in\n" << json;
    }
    const bool scaled = (c->rope.type == RopeType::kLlama3);
    EXPECT_EQ(json.find("\"rope_scaling\": null") != std::string::npos, !scaled) << json;
    EXPECT_EQ(json.find("\"rope_type\": \"llama3\"") != std::string::npos, scaled) << json;
  }
}

TEST(ConfigTest, HuggingFaceConfigParsesToPreset) {
  auto parsed = ParseConfigJson(kLlama32_1B);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto preset = PresetConfig("llama-3.2-1b");
  ASSERT_TRUE(preset.ok());
  ExpectSameConfig(*parsed, *preset);
  EXPECT_EQ(parsed->NumParameters(), preset->NumParameters());
}

TEST(ConfigTest, DefaultsFollowTransformers) {
  // Minimal config: kv heads default to heads, head_dim to hidden/heads, and the optional keys
  // to transformers' LlamaConfig defaults. "type" is the older spelling of "rope_type".
  auto c = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
                       "high_freq_factor": 4, "original_max_position_embeddings": 128},
      "eos_token_id": [7, 8, 9]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rope.head_dim, 32);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope.theta, 10000.0);
  EXPECT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_TRUE((c->rope.type == RopeType::kLlama3));
  EXPECT_EQ(c->rope.original_max_position, 128);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_EQ(c->eos_token_id, 7);
  EXPECT_EQ(ConfigToJson(*c).find("bos_token_id"), std::string::npos);

  // Explicit nulls mean "unset", as transformers writes them; "default" rope means none.
  auto n = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "num_key_value_heads": null, "head_dim": null, "rope_scaling": {"rope_type": "default"}})");
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(n->num_key_value_heads, 8);
  EXPECT_EQ(n->head_dim, 32);
  EXPECT_FALSE((n->rope.type == RopeType::kLlama3));
}

TEST(ConfigTest, BadConfigsNameTheKey) {
  const std::string good = kLlama32_1B;
  ASSERT_TRUE(ParseConfigJson(good).ok());
  ExpectInvalid("{\"hidden_size\": 2048,", {"config.json", "not a JSON object", "parse error"});
  ExpectInvalid("", {"not a JSON object"});
  ExpectInvalid("[1, 2]", {"JSON object"});
  ExpectInvalid(Replace(good, "\"hidden_size\": 2048,", ""), {"hidden_size", "missing"});
  ExpectInvalid(Replace(good, "\"vocab_size\": 128256", "\"pad_token_id\": 1"),
                {"vocab_size", "missing"});
  ExpectInvalid(Replace(good, "\"hidden_size\": 2048", "\"hidden_size\": \"2048\""),
                {"hidden_size", "integer", "string"});
  ExpectInvalid(Replace(good, "\"hidden_size\": 2048", "\"hidden_size\": 2048.5"),
                {"hidden_size", "integer"});
  ExpectInvalid(Replace(good, "\"rope_theta\": 500000.0", "\"rope_theta\": \"big\""),
                {"rope_theta", "number"});
  ExpectInvalid(Replace(good, "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1"),
                {"tie_word_embeddings", "boolean"});
  ExpectInvalid(Replace(good, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5"),
                {"num_key_value_heads", "does not divide", "32"});
  ExpectInvalid(Replace(good, "\"num_attention_heads\": 32", "\"num_attention_heads\": 0"),
                {"num_attention_heads", "positive"});
  ExpectInvalid(Replace(good, "\"intermediate_size\": 8192", "\"intermediate_size\": -1"),
                {"intermediate_size", "positive"});
  ExpectInvalid(Replace(good, "\"head_dim\": 64", "\"head_dim\": 63"), {"head_dim", "even"});
  ExpectInvalid(Replace(Replace(good, "\"head_dim\": 64,", ""), "\"hidden_size\": 2048",
                        "\"hidden_size\": 2050"),
                {"hidden_size", "not divisible"});
  ExpectInvalid(Replace(good, "\"rope_type\": \"llama3\"", "\"rope_type\": \"dynamic\""),
                {"rope_scaling.rope_type", "dynamic",
                 "(Ithaca implements \"default\", \"linear\", \"llama3\" and \"yarn\")"});
  ExpectInvalid(Replace(good, "\"factor\": 32.0,", ""), {"rope_scaling.factor", "missing"});
  ExpectInvalid(Replace(good, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5"),
                {"rope_scaling.high_freq_factor"});
  // Without a rope_type transformers takes "default", which has no factor.
  ExpectInvalid(Replace(good, "\"rope_type\": \"llama3\"", "\"kind\": \"llama3\""),
                {"rope_scaling.factor", "default", "absent rope_type"});
  ExpectInvalid(Replace(good, "\"rope_scaling\": {", "\"rope_scaling\": 3, \"rope_parameters\": {"),
                {"rope_scaling", "object or null"});
  ExpectInvalid(Replace(good, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""),
                {"hidden_act", "gelu"});
  ExpectInvalid(Replace(good, "\"mlp_bias\": false", "\"mlp_bias\": true"), {"mlp_bias"});
  ExpectInvalid(Replace(good, "\"vocab_size\": 128256", "\"vocab_size\": 18446744073709551615"),
                {"vocab_size", "range"});
  ExpectInvalid(Replace(good, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0"),
                {"rms_norm_eps", "positive"});
  ExpectInvalid(Replace(good, "\"num_hidden_layers\": 16", "\"num_hidden_layers\": 1e12"),
                {"num_hidden_layers", "at most"});
}

// Llama-3.2-1B as transformers 5 saves it: RoPE settings (theta included) in rope_parameters.
std::string Transformers5Dialect() {
  std::string s = kLlama32_1B;
  s = Replace(s, "  \"rope_theta\": 500000.0,\n", "");
  s = Replace(s, "\"rope_scaling\": {", "\"rope_parameters\": {\n    \"rope_theta\": 500000.0,");
  s = Replace(s, "\"torch_dtype\"", "\"dtype\"");
  return Replace(s, "\"4.45.0.dev0\"", "\"5.0.0\"");
}

TEST(ConfigTest, RopeParametersDialectMatchesHubDialect) {
  const std::string v5 = Transformers5Dialect();
  ASSERT_EQ(v5.find("\"rope_scaling\""), std::string::npos) << v5;
  auto parsed = ParseConfigJson(v5);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << v5;
  auto preset = PresetConfig("llama-3.2-1b");
  ASSERT_TRUE(preset.ok());
  ExpectSameConfig(*parsed, *preset);
  EXPECT_EQ(parsed->rope.theta, 500000.0);  // from inside rope_parameters, not the 10000 default
  EXPECT_TRUE((parsed->rope.type == RopeType::kLlama3));

  // Llama-3-8B re-saved: no scaling, theta only inside rope_parameters.
  auto plain = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rope_theta, 500000.0);
  EXPECT_EQ(plain->rope.theta, 500000.0);
  EXPECT_FALSE((plain->rope.type == RopeType::kLlama3));

  // transformers 5's defaults inside rope_parameters: rope_type "default", and llama3's
  // original_max_position_embeddings = max_position_embeddings.
  auto untyped = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "rope_parameters": {"rope_theta": 123456.0}})");
  ASSERT_TRUE(untyped.ok()) << untyped.status();
  EXPECT_EQ(untyped->rope.theta, 123456.0);
  EXPECT_FALSE((untyped->rope.type == RopeType::kLlama3));
  auto no_original = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}})");
  ASSERT_TRUE(no_original.ok()) << no_original.status();
  EXPECT_TRUE((no_original->rope.type == RopeType::kLlama3));
  EXPECT_EQ(no_original->rope.original_max_position, 4096);
  EXPECT_EQ(no_original->rope.theta, 10000.0);

  // Both dialects at once (a file converted by hand) are fine while they agree.
  std::string both = Replace(v5, "\"rms_norm_eps\"", "\"rope_theta\": 500000, \"rms_norm_eps\"");
  both = Replace(both, "\"rms_norm_eps\"",
                 "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32, "
                 "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                 "\"original_max_position_embeddings\": 8192}, \"rms_norm_eps\"");
  auto agreed = ParseConfigJson(both);
  ASSERT_TRUE(agreed.ok()) << agreed.status() << "\n" << both;
  ExpectSameConfig(*agreed, *preset);
}

TEST(ConfigTest, ContradictoryRopeSettingsAreErrors) {
  const std::string v5 = Transformers5Dialect();
  ExpectInvalid(Replace(v5, "\"rms_norm_eps\"", "\"rope_theta\": 10000.0, \"rms_norm_eps\""),
                {"rope_parameters.rope_theta", "500000", "contradicts rope_theta", "10000"});
  ExpectInvalid(Replace(v5, "\"rms_norm_eps\"",
                        "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, "
                        "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                        "\"original_max_position_embeddings\": 8192}, \"rms_norm_eps\""),
                {"rope_parameters", "factor 32", "contradicts rope_scaling", "factor 8"});
  ExpectInvalid(Replace(v5, "\"rms_norm_eps\"",
                        "\"rope_scaling\": {\"rope_type\": \"default\"}, \"rms_norm_eps\""),
                {"rope_parameters", "contradicts rope_scaling", "default"});
  ExpectInvalid(Replace(kLlama32_1B, "\"rope_type\": \"llama3\"",
                        "\"rope_type\": \"llama3\", \"type\": \"linear\""),
                {"rope_scaling.type", "linear", "contradicts"});
}

TEST(ConfigTest, RopeVariantsIthacaDoesNotImplementAreErrors) {
  const std::string v5 = Transformers5Dialect();
  ExpectInvalid(Replace(v5, "\"rope_type\": \"llama3\"", "\"rope_type\": \"dynamic\""),
                {"rope_parameters.rope_type", "dynamic"});
  // llama3's keys under another implemented type: the file means a rope Ithaca would not compute.
  ExpectInvalid(Replace(v5, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""),
                {"rope_parameters.high_freq_factor", "not a parameter", "yarn"});
  ExpectInvalid(Replace(kLlama32_1B, "\"rope_type\": \"llama3\"", "\"rope_type\": \"linear\""),
                {"rope_scaling.high_freq_factor", "not a parameter", "linear"});
  for (const char* type : {"dynamic", "longrope", "ntk"}) {
    ExpectInvalid(Replace(kLlama32_1B, "\"rope_type\": \"llama3\"",
                          absl::StrCat("\"rope_type\": \"", type, "\"")),
                  {"rope_scaling.rope_type", type});
  }
  ExpectInvalid(Replace(v5, "\"rope_type\": \"llama3\"", "\"kind\": \"llama3\""),
                {"rope_parameters.factor", "default"});
  ExpectInvalid(Replace(v5, "\"factor\": 32.0,", ""), {"rope_parameters.factor", "missing"});
  ExpectInvalid(Replace(v5, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5"),
                {"rope_parameters.high_freq_factor", "exceed"});
  ExpectInvalid(Replace(v5, "\"rope_theta\": 500000.0", "\"rope_theta\": \"big\""),
                {"rope_parameters.rope_theta", "number"});
  ExpectInvalid(Replace(v5, "\"rope_theta\": 500000.0", "\"rope_theta\": -1"), {"rope_theta"});
  ExpectInvalid(
      Replace(v5, "\"rope_parameters\": {", "\"rope_parameters\": [1], \"rope_scaling\": {"),
      {"rope_parameters", "object or null"});
  // Parameters of other rope types would be ignored by transformers with a warning; here they
  // mean the file asks for a rope Ithaca does not compute.
  ExpectInvalid(Replace(v5, "\"factor\": 32.0,", "\"factor\": 32.0, \"beta_fast\": 32,"),
                {"rope_parameters.beta_fast", "llama3"});
  ExpectInvalid(R"({"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 8, "vocab_size": 1000,
      "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default", "factor": 8.0}})",
                {"rope_parameters.factor", "default"});
  ExpectInvalid(
      Replace(v5, "\"factor\": 32.0,", "\"factor\": 32.0, \"partial_rotary_factor\": 0.5,"),
      {"rope_parameters.partial_rotary_factor", "0.5"});
  EXPECT_TRUE(ParseConfigJson(Replace(v5, "\"factor\": 32.0,",
                                      "\"factor\": 32.0, \"partial_rotary_factor\": 1.0,"))
                  .ok());
  // transformers' per-layer-type form (Gemma-style) is not Llama's.
  ExpectInvalid(R"({"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
      "num_attention_heads": 8, "vocab_size": 1000,
      "rope_parameters": {"full_attention": {"rope_theta": 10000.0, "rope_type": "default"}}})",
                {"rope_parameters.full_attention", "default"});
}

TEST(ConfigTest, KeysThatChangeTheModelAreErrors) {
  const std::string good = kLlama32_1B;
  ExpectInvalid(Replace(good, "\"model_type\": \"llama\"", "\"model_type\": \"gemma\""),
                {"model_type", "gemma"});
  ExpectInvalid(Replace(good, "\"attention_bias\": false", "\"attention_bias\": true"),
                {"attention_bias", "bias"});
  ExpectInvalid(Replace(good, "\"mlp_bias\": false", "\"mlp_bias\": true"), {"mlp_bias"});
  ExpectInvalid(Replace(good, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu_pytorch_tanh\""),
                {"hidden_act", "gelu_pytorch_tanh"});
  ExpectInvalid(
      Replace(good, "\"mlp_bias\": false", "\"mlp_bias\": false, \"sliding_window\": 4096"),
      {"sliding_window", "4096"});
  ExpectInvalid(Replace(good, "\"attention_dropout\": 0.0", "\"attention_dropout\": 0.1"),
                {"attention_dropout", "0.1"});
  ExpectInvalid(Replace(good, "\"mlp_bias\": false",
                        "\"mlp_bias\": false, \"quantization_config\": {\"bits\": 4}"),
                {"quantization_config", "unknown key"});
  ExpectInvalid(Replace(good, "\"mlp_bias\": false", "\"mlp_bias\": false, \"logits_scaling\": 8"),
                {"logits_scaling", "unknown key"});

  // Keys that leave the math alone are accepted, whatever their value.
  const std::string harmless =
      Replace(good, "\"mlp_bias\": false",
              "\"mlp_bias\": false, \"sliding_window\": null, \"dtype\": \"float32\", "
              "\"pad_token_id\": null, \"_name_or_path\": \"meta-llama/Llama-3.2-1B\", "
              "\"id2label\": {\"0\": \"LABEL_0\"}, \"output_attentions\": false, \"hidden_act\": "
              "\"swish\", \"pretraining_tp\": 2");
  auto c = ParseConfigJson(Replace(harmless, "\"hidden_act\": \"silu\",", ""));
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameConfig(*c, *PresetConfig("llama-3.2-1b"));
}

TEST(ConfigTest, ValidateCatchesHandBuiltMistakes) {
  auto c = PresetConfig("tiny");
  ASSERT_TRUE(c.ok());
  LlamaConfig bad = *c;
  bad.head_dim = 32;  // rope.head_dim left at 16
  absl::Status st = ValidateConfig(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("rope.head_dim"), std::string::npos) << st;

  bad = *c;
  bad.num_key_value_heads = 3;
  st = ValidateConfig(bad);
  EXPECT_NE(st.message().find("num_key_value_heads"), std::string::npos) << st;

  EXPECT_FALSE(ValidateConfig(LlamaConfig()).ok());  // all sizes zero
}

TEST(ConfigTest, LoadFromFileAndDirectory) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/cfg";
  ASSERT_TRUE(MakeDirs(dir).ok());
  auto tiny = PresetConfig("tiny");
  ASSERT_TRUE(tiny.ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/config.json", ConfigToJson(*tiny)).ok());
  for (const std::string& path : {dir, dir + "/config.json"}) {
    auto c = LoadConfigJson(path);
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectSameConfig(*c, *tiny);
  }
  auto missing = LoadConfigJson(dir + "/nope.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  // Errors from a file name that file rather than "config.json".
  ASSERT_TRUE(WriteFileAtomic(dir + "/broken.json", "{\"hidden_size\": true}").ok());
  auto broken = LoadConfigJson(dir + "/broken.json");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find(dir + "/broken.json: hidden_size"), std::string::npos)
      << broken.status();
}

// A spec may name any readable file as model.config: the error says what is wrong with it and
// where, never what it holds (the JSON parser's own message quotes the bytes it read).
TEST(ConfigTest, ErrorsNeverQuoteTheFile) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/secret";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string secret = "root:$6$hunter2-SECRET-VALUE:19000:0:99999:7:::";
  for (const std::string& content :
       {secret + "\n", "\"" + secret + "\"", std::string("12345678901234567890"),
        "[\"" + secret + "\"]", "{\"" + secret + "\" " + secret + "}",
        std::string("\x7f"
                    "ELF\x02\x01") +
            secret}) {
    const std::string path = dir + "/shadow";
    ASSERT_TRUE(WriteFileAtomic(path, content).ok());
    absl::StatusOr<LlamaConfig> c = LoadConfigJson(path);
    ASSERT_FALSE(c.ok());
    const std::string full(c.status().message());
    ASSERT_EQ(full.rfind(path, 0), 0u) << full;
    const std::string msg = full.substr(path.size());  // what follows the file's name
    EXPECT_EQ(msg.find("hunter2"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("root"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("1234"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("ELF"), std::string::npos) << msg;
    EXPECT_EQ(msg.rfind(": not a JSON object (", 0), 0u) << msg;
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/shadow", secret).ok());
  EXPECT_EQ(LoadConfigJson(dir + "/shadow").status().message(),
            dir + "/shadow: not a JSON object (parse error at byte 0)");
}

// The config.json files published on the hub for Qwen3-14B, Qwen2.5-0.5B and Mistral-7B-v0.3.
constexpr char kQwen3_14B[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408,
  "max_position_embeddings": 40960, "max_window_layers": 40, "model_type": "qwen3",
  "num_attention_heads": 40, "num_hidden_layers": 40, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";
constexpr char kQwen25_05B[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false,
  "use_sliding_window": false, "vocab_size": 151936
})";
constexpr char kMistral7B_v03[] = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0",
  "use_cache": true, "vocab_size": 32768
})";

TEST(FamilyConfigTest, HubConfigsParseToTheirPresets) {
  for (const auto& [json, preset] :
       {std::pair{kQwen3_14B, "qwen3-14b"}, std::pair{kQwen25_05B, "qwen2.5-0.5b"},
        std::pair{kMistral7B_v03, "mistral-7b-v0.3"}}) {
    SCOPED_TRACE(preset);
    auto c = ParseConfigJson(json);
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectSameConfig(*c, *PresetConfig(preset));
  }
  auto q3 = PresetConfig("qwen3-14b");
  EXPECT_TRUE(q3->qk_norm && !q3->qkv_bias && q3->sliding_window == 0);
  auto q2 = PresetConfig("qwen2.5-0.5b");
  EXPECT_TRUE(q2->qkv_bias && !q2->qk_norm && q2->tie_word_embeddings);
  EXPECT_EQ(q2->head_dim, 64);
  // Parameter counts against the published ones: Qwen2.5-0.5B 494,032,768 (biases included),
  // Qwen3-0.6B 596,049,920 (q/k norms included, embeddings tied), Mistral-7B-v0.3 7,248,023,552.
  EXPECT_EQ(q2->NumParameters(), 494032768);
  EXPECT_EQ(PresetConfig("qwen3-0.6b")->NumParameters(), 596049920);
  EXPECT_EQ(PresetConfig("mistral-7b-v0.3")->NumParameters(), 7248023552);
}

TEST(FamilyConfigTest, EveryPresetIsValidAndRoundTrips) {
  ASSERT_GE(PresetNames().size(), 17u);
  for (const std::string& name : PresetNames()) {
    SCOPED_TRACE(name);
    auto c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
    const std::string json = ConfigToJson(*c);
    EXPECT_NE(json.find(absl::StrCat("\"model_type\": \"", ModelTypeName(c->family), "\"")),
              std::string::npos)
        << json;
    auto back = ParseConfigJson(json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    ExpectSameConfig(*back, *c);
  }
  EXPECT_NE(PresetConfig("qwen9-1b").status().message().find("qwen3-0.6b"), std::string::npos);
}

// Qwen2/Qwen3's use_sliding_window, as transformers reads it: the window on the layers from
// max_window_layers on; none when that is past the last layer (Qwen2.5-0.5B's published 24 of
// 24) or the window is null; transformers' defaults (4096, from layer 28) when keys are absent.
TEST(FamilyConfigTest, QwenWindowFromMaxWindowLayers) {
  const std::string on =
      Replace(kQwen25_05B, "\"use_sliding_window\": false", "\"use_sliding_window\": true");
  auto none = ParseConfigJson(on);  // max_window_layers 24 of 24 layers: no layer windowed
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->sliding_window, 0);
  auto some =
      ParseConfigJson(Replace(on, "\"max_window_layers\": 24", "\"max_window_layers\": 20"));
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(some->sliding_window, 32768);
  EXPECT_EQ(some->window_first_layer, 20);
  EXPECT_EQ(some->LayerWindow(19), 0);
  EXPECT_EQ(some->LayerWindow(20), 32768);
  EXPECT_EQ(some->LayerWindow(23), 32768);
  const std::string json = ConfigToJson(*some);  // exported as the same keys
  EXPECT_NE(json.find("\"use_sliding_window\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"max_window_layers\": 20"), std::string::npos) << json;
  auto back = ParseConfigJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameConfig(*back, *some);
  // The window null: none, whatever max_window_layers says.
  auto null_window =
      ParseConfigJson(Replace(Replace(on, "\"max_window_layers\": 24", "\"max_window_layers\": 2"),
                              "\"sliding_window\": 32768", "\"sliding_window\": null"));
  ASSERT_TRUE(null_window.ok()) << null_window.status();
  EXPECT_EQ(null_window->sliding_window, 0);
  // Absent keys take transformers' defaults: a window of 4096 from layer 28 (of Qwen3-14B's 40).
  auto defaults = ParseConfigJson(Replace(
      Replace(Replace(kQwen3_14B, "\"use_sliding_window\": false", "\"use_sliding_window\": true"),
              "\"sliding_window\": null,", ""),
      "\"max_window_layers\": 40,", ""));
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->sliding_window, 4096);
  EXPECT_EQ(defaults->window_first_layer, 28);
  // use_sliding_window false ignores both keys, as transformers does.
  auto off = ParseConfigJson(
      Replace(kQwen25_05B, "\"max_window_layers\": 24", "\"max_window_layers\": 3"));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->sliding_window, 0);
  ExpectInvalid(Replace(on, "\"sliding_window\": 32768", "\"sliding_window\": 0"),
                {"sliding_window", "positive"});
  ExpectInvalid(Replace(on, "\"max_window_layers\": 24", "\"max_window_layers\": -1"),
                {"max_window_layers", ">= 0"});
  // transformers 5's layer_types must be the kinds these keys give each layer.
  std::string kinds = "\"layer_types\": [";
  for (int l = 0; l < 24; ++l) {
    kinds += absl::StrCat(l ? ", " : "", l >= 20 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  kinds += "], ";
  const std::string with_20 = Replace(on, "\"max_window_layers\": 24", "\"max_window_layers\": 20");
  auto listed = ParseConfigJson(Replace(with_20, "\"model_type\"", kinds + "\"model_type\""));
  ASSERT_TRUE(listed.ok()) << listed.status();
  ExpectSameConfig(*listed, *some);
  ExpectInvalid(Replace(Replace(with_20, "\"max_window_layers\": 20", "\"max_window_layers\": 21"),
                        "\"model_type\"", kinds + "\"model_type\""),
                {"layer_types[20]", "\"sliding_attention\"", "\"full_attention\""});
  LlamaConfig bad = *some;
  bad.window_first_layer = 24;
  EXPECT_FALSE(ValidateConfig(bad).ok());
  bad = *PresetConfig("llama-3.2-1b");
  bad.sliding_window = 8;
  EXPECT_FALSE(ValidateConfig(bad).ok());
}

TEST(FamilyConfigTest, MistralWindowAndFamilyKeys) {
  auto w = ParseConfigJson(
      Replace(kMistral7B_v03, "\"sliding_window\": null", "\"sliding_window\": 4096"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->sliding_window, 4096);
  auto back = ParseConfigJson(ConfigToJson(*w));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->sliding_window, 4096);
  ExpectInvalid(Replace(kMistral7B_v03, "\"sliding_window\": null", "\"sliding_window\": 0"),
                {"sliding_window", "positive"});
  ExpectInvalid(Replace(kQwen3_14B, "\"attention_bias\": false", "\"attention_bias\": true"),
                {"attention_bias", "qwen3"});
  ExpectInvalid(Replace(kQwen3_14B, "\"head_dim\": 128,", ""), {"head_dim", "required for qwen3"});
  ExpectInvalid(Replace(kQwen3_14B, "\"num_key_value_heads\": 8,", ""),
                {"num_key_value_heads", "missing"});
  ExpectInvalid(Replace(kQwen25_05B, "\"use_mrope\": false", "\"use_mrope\": true"), {"use_mrope"});
  ExpectInvalid(
      Replace(kMistral7B_v03, "\"rms_norm_eps\"", "\"max_window_layers\": 3, \"rms_norm_eps\""),
      {"max_window_layers", "mistral"});
  // transformers 5's layer_types: one per layer (Qwen3-14B's 40), every layer full (or, with a
  // window, sliding).
  auto kinds = [](const std::string& first) {
    std::string list = "\"layer_types\": [\"" + first + "\"";
    for (int i = 1; i < 40; ++i) list += ", \"full_attention\"";
    return list + "], \"rms_norm_eps\"";
  };
  auto typed = ParseConfigJson(Replace(kQwen3_14B, "\"rms_norm_eps\"", kinds("full_attention")));
  EXPECT_TRUE(typed.ok()) << typed.status();
  ExpectInvalid(Replace(kQwen3_14B, "\"rms_norm_eps\"", kinds("sliding_attention")),
                {"layer_types[0]", "full_attention"});
  ExpectInvalid(Replace(kQwen3_14B, "\"rms_norm_eps\"",
                        "\"layer_types\": [\"full_attention\"], \"rms_norm_eps\""),
                {"layer_types", "1 entries for 40 layers"});
  // Qwen2's attention has no head_dim of its own.
  ExpectInvalid(
      Replace(kQwen25_05B, "\"hidden_size\": 896", "\"head_dim\": 32, \"hidden_size\": 896"),
      {"head_dim", "qwen2"});
}

TEST(FamilyConfigTest, LinearAndYarnRopeInBothDialects) {
  // Qwen3's documented YaRN long-context setting, in the hub dialect and in rope_parameters.
  const std::string hub = Replace(kQwen3_14B, "\"rope_scaling\": null",
                                  "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, "
                                  "\"original_max_position_embeddings\": 32768}");
  auto y = ParseConfigJson(hub);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(y->rope.type, RopeType::kYarn);
  EXPECT_EQ(y->rope.factor, 4.0);
  EXPECT_EQ(y->rope.original_max_position, 32768);
  EXPECT_DOUBLE_EQ(y->rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_EQ(y->rope.beta_fast, 32.0);
  EXPECT_EQ(y->rope.beta_slow, 1.0);
  EXPECT_TRUE(y->rope.truncate);
  std::string v5 = Replace(hub, "\"rope_theta\": 1000000,", "");
  v5 = Replace(v5, "\"rope_scaling\": {", "\"rope_parameters\": {\"rope_theta\": 1000000, ");
  auto y5 = ParseConfigJson(v5);
  ASSERT_TRUE(y5.ok()) << y5.status();
  ExpectSameConfig(*y5, *y);
  auto back = ParseConfigJson(ConfigToJson(*y));
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameConfig(*back, *y);
  // DeepSeek's mscale pair and explicit betas, no truncation.
  auto m = ParseConfigJson(Replace(
      kQwen3_14B, "\"rope_scaling\": null",
      "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 40, \"mscale\": 1.0, "
      "\"mscale_all_dim\": 0.5, \"beta_fast\": 16, \"beta_slow\": 2, \"truncate\": false}"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->rope.attention_factor,
                   (0.1 * std::log(40.0) + 1.0) / (0.05 * std::log(40.0) + 1.0));
  EXPECT_EQ(m->rope.beta_fast, 16.0);
  EXPECT_FALSE(m->rope.truncate);
  EXPECT_EQ(m->rope.original_max_position, 40960);  // max_position_embeddings
  auto lin = ParseConfigJson(Replace(kMistral7B_v03, "\"rms_norm_eps\"",
                                     "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}, "
                                     "\"rms_norm_eps\""));
  ASSERT_TRUE(lin.ok()) << lin.status();
  EXPECT_EQ(lin->rope.type, RopeType::kLinear);
  RopeConfig plain = lin->rope;
  plain.type = RopeType::kDefault;
  const std::vector<float> scaled = RopeInverseFrequencies(lin->rope);
  const std::vector<float> base = RopeInverseFrequencies(plain);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_EQ(scaled[i], base[i] / 2.0f);
  ExpectInvalid(Replace(hub, "\"factor\": 4.0, ", ""), {"rope_scaling.factor", "missing"});
  ExpectInvalid(Replace(hub, "\"factor\": 4.0", "\"factor\": 4.0, \"low_freq_factor\": 1"),
                {"rope_scaling.low_freq_factor", "not a parameter", "yarn"});
  ExpectInvalid(Replace(hub, "\"factor\": 4.0", "\"factor\": 4.0, \"attention_factor\": -1"),
                {"rope_scaling.attention_factor", "positive"});
  // rope_scaling and rope_parameters that disagree about yarn.
  ExpectInvalid(Replace(hub, "\"rms_norm_eps\"",
                        "\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8.0, "
                        "\"original_max_position_embeddings\": 32768}, \"rms_norm_eps\""),
                {"rope_parameters", "yarn factor 8", "contradicts rope_scaling", "yarn factor 4"});
}

TEST(ConfigBoundsTest, AHugeModelIsRefusedNamingTheKey) {
  LlamaConfig cfg = *PresetConfig("tiny");
  cfg.num_hidden_layers = 1000000000;
  absl::Status st = ValidateConfig(cfg);
  EXPECT_NE(st.message().find("num_hidden_layers: must be at most"), std::string::npos) << st;
  // Whatever the value above the bound, the message names the one bound layers have.
  for (int64_t layers : {int64_t{2000}, int64_t{1000000000}}) {
    cfg.num_hidden_layers = layers;
    st = ValidateConfig(cfg);
    EXPECT_NE(st.message().find(absl::StrCat("num_hidden_layers: must be at most ", kMaxLayers,
                                             ", got ", layers)),
              std::string::npos)
        << st;
  }
  cfg = *PresetConfig("llama-3-8b");
  cfg.num_hidden_layers = 1024;
  cfg.hidden_size = cfg.intermediate_size = 1 << 20;
  st = ValidateConfig(cfg);
  EXPECT_NE(st.message().find("too large"), std::string::npos) << st;
  EXPECT_TRUE(ValidateConfig(*PresetConfig("llama-3-8b")).ok());
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

// Issue 43: a layer_types list of another length than the layers, and token ids outside the
// vocabulary, were accepted.
TEST(ConfigTest, LayerTypesAndTokenIdsMustFitTheModel) {
  auto with = [](const std::string& extra) {
    std::string json = kLlama32_1B;
    json.insert(json.rfind('}'), ", " + extra);
    return ParseConfigJson(json);
  };
  std::string many = "\"layer_types\": [";
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&many, i ? "," : "", "\"full_attention\"");
  auto long_list = with(many + "]");
  ASSERT_FALSE(long_list.ok());
  EXPECT_NE(long_list.status().message().find("100000 entries for 16 layers"), std::string::npos)
      << long_list.status();
  std::string sixteen = "\"layer_types\": [";
  for (int i = 0; i < 16; ++i) absl::StrAppend(&sixteen, i ? "," : "", "\"full_attention\"");
  EXPECT_TRUE(with(sixteen + "]").ok());
  auto big_eos = ParseConfigJson(absl::StrReplaceAll(
      std::string(kLlama32_1B), {{"\"eos_token_id\": 128001", "\"eos_token_id\": 128256"}}));
  ASSERT_FALSE(big_eos.ok());
  EXPECT_NE(big_eos.status().message().find("eos_token_id"), std::string::npos) << big_eos.status();
}

}  // namespace
}  // namespace ithaca
