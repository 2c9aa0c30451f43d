// Tests for LlamaConfig: presets, config.json parsing and writing, validation, parameter counts.
#include "engine/model/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"

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
  EXPECT_TRUE(one->rope.llama3_scaling && three->rope.llama3_scaling);
  EXPECT_EQ(three->rope.factor, 32.0);
  EXPECT_FALSE(eight->rope.llama3_scaling);
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
    const bool scaled = c->rope.llama3_scaling;
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
  EXPECT_TRUE(c->rope.llama3_scaling);
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
  EXPECT_FALSE(n->rope.llama3_scaling);
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
  ExpectInvalid(Replace(good, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""),
                {"rope_scaling.rope_type", "yarn"});
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
  EXPECT_TRUE(parsed->rope.llama3_scaling);

  // Llama-3-8B re-saved: no scaling, theta only inside rope_parameters.
  auto plain = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rope_theta, 500000.0);
  EXPECT_EQ(plain->rope.theta, 500000.0);
  EXPECT_FALSE(plain->rope.llama3_scaling);

  // transformers 5's defaults inside rope_parameters: rope_type "default", and llama3's
  // original_max_position_embeddings = max_position_embeddings.
  auto untyped = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "rope_parameters": {"rope_theta": 123456.0}})");
  ASSERT_TRUE(untyped.ok()) << untyped.status();
  EXPECT_EQ(untyped->rope.theta, 123456.0);
  EXPECT_FALSE(untyped->rope.llama3_scaling);
  auto no_original = ParseConfigJson(R"({"hidden_size": 256, "intermediate_size": 512,
      "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 1000,
      "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "llama3",
      "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}})");
  ASSERT_TRUE(no_original.ok()) << no_original.status();
  EXPECT_TRUE(no_original->rope.llama3_scaling);
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
  ExpectInvalid(Replace(v5, "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\""),
                {"rope_parameters.rope_type", "yarn"});
  for (const char* type : {"linear", "dynamic", "longrope"}) {
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
  ExpectInvalid(Replace(good, "\"model_type\": \"llama\"", "\"model_type\": \"mistral\""),
                {"model_type", "mistral"});
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

TEST(ConfigBoundsTest, AHugeModelIsRefusedNamingTheKey) {
  LlamaConfig cfg = *PresetConfig("tiny");
  cfg.num_hidden_layers = 1000000000;
  absl::Status st = ValidateConfig(cfg);
  EXPECT_NE(st.message().find("num_hidden_layers: must be at most"), std::string::npos) << st;
  cfg = *PresetConfig("llama-3-8b");
  cfg.num_hidden_layers = 1024;
  cfg.hidden_size = cfg.intermediate_size = 1 << 20;
  st = ValidateConfig(cfg);
  EXPECT_NE(st.message().find("too large"), std::string::npos) << st;
  EXPECT_TRUE(ValidateConfig(*PresetConfig("llama-3-8b")).ok());
}

}  // namespace
}  // namespace ithaca
