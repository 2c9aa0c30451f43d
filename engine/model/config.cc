// LlamaConfig <-> Hugging Face config.json, validation, parameter counts and presets.
#include "engine/model/config.h"

#include <sys/stat.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "engine/core/file_util.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

// Transformers' LlamaConfig defaults, used for optional keys a config.json omits, so a file
// means here what it means to Hugging Face (these differ from LlamaConfig's member defaults).
constexpr double kHfRopeTheta = 10000.0;
constexpr double kHfRmsNormEps = 1e-6;
constexpr int64_t kHfMaxPositions = 2048;

// A short description of a JSON value for error messages; containers are not dumped, so a
// hostile file cannot make the message (or the recursion printing it) large.
std::string Describe(const Json& v) {
  if (v.is_object() || v.is_array()) return std::string("an ") + v.type_name();
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return absl::StrCat(v.type_name(), " ", s);
}

// Reads typed keys out of one JSON object; every problem becomes an INVALID_ARGUMENT naming the
// source and the key's full path ("config.json: rope_scaling.factor: ...").
class KeyReader {
 public:
  KeyReader(const Json& obj, const std::string& source, const std::string& prefix)
      : obj_(obj), source_(source), prefix_(prefix) {}

  absl::Status Error(const std::string& key, const std::string& problem) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", prefix_, key, ": ", problem));
  }

  // The value, or nullptr when the key is absent or null (Hugging Face writes null for unset).
  const Json* Find(const std::string& key) const {
    auto it = obj_.find(key);
    return it == obj_.end() || it->is_null() ? nullptr : &*it;
  }

  // Leaves *out untouched when an optional key is absent.
  absl::Status Int(const std::string& key, bool required, int64_t* out) const {
    const Json* v = Find(key);
    if (!v) return required ? Error(key, "missing (required)") : absl::OkStatus();
    if (v->is_number_unsigned() && v->get<uint64_t>() > std::numeric_limits<int64_t>::max()) {
      return Error(key, absl::StrCat("out of range, got ", Describe(*v)));
    }
    if (v->is_number_integer()) {
      *out = v->get<int64_t>();
      return absl::OkStatus();
    }
    // 2048.0 is an integer written by a sloppy tool; 2048.5 is not.
    if (v->is_number_float()) {
      double d = v->get<double>();
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) < 9.0e15) {
        *out = static_cast<int64_t>(d);
        return absl::OkStatus();
      }
    }
    return Error(key, absl::StrCat("expected an integer, got ", Describe(*v)));
  }

  absl::Status Number(const std::string& key, bool required, double* out) const {
    const Json* v = Find(key);
    if (!v) return required ? Error(key, "missing (required)") : absl::OkStatus();
    if (!v->is_number()) return Error(key, absl::StrCat("expected a number, got ", Describe(*v)));
    *out = v->get<double>();
    return absl::OkStatus();
  }

  absl::Status Bool(const std::string& key, bool* out) const {
    const Json* v = Find(key);
    if (!v) return absl::OkStatus();
    if (!v->is_boolean()) return Error(key, absl::StrCat("expected a boolean, got ", Describe(*v)));
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  // Optional string; *present tells whether it was there.
  absl::Status String(const std::string& key, std::string* out, bool* present) const {
    const Json* v = Find(key);
    *present = v != nullptr;
    if (!v) return absl::OkStatus();
    if (!v->is_string()) return Error(key, absl::StrCat("expected a string, got ", Describe(*v)));
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

 private:
  const Json& obj_;
  const std::string& source_;
  std::string prefix_;
};

absl::Status ParseRopeScaling(const Json& root, const std::string& source, RopeConfig* rope) {
  KeyReader top(root, source, "");
  const Json* rs = top.Find("rope_scaling");
  rope->llama3_scaling = false;
  if (!rs) return absl::OkStatus();
  if (!rs->is_object()) {
    return top.Error("rope_scaling",
                     absl::StrCat("expected an object or null, got ", Describe(*rs)));
  }
  KeyReader r(*rs, source, "rope_scaling.");
  std::string type;
  bool present = false;
  // Older configs say "type"; newer ones "rope_type" (transformers accepts both).
  RETURN_IF_ERROR(r.String("rope_type", &type, &present));
  if (!present) RETURN_IF_ERROR(r.String("type", &type, &present));
  if (!present) return r.Error("rope_type", "missing (rope_scaling needs a rope_type)");
  if (type == "default") return absl::OkStatus();  // transformers' name for "no scaling"
  if (type != "llama3") {
    return r.Error("rope_type",
                   absl::StrCat("unsupported \"", type, "\" (Ithaca implements \"llama3\" only)"));
  }
  rope->llama3_scaling = true;
  RETURN_IF_ERROR(r.Number("factor", true, &rope->factor));
  RETURN_IF_ERROR(r.Number("low_freq_factor", true, &rope->low_freq_factor));
  RETURN_IF_ERROR(r.Number("high_freq_factor", true, &rope->high_freq_factor));
  return r.Int("original_max_position_embeddings", true, &rope->original_max_position);
}

absl::StatusOr<LlamaConfig> ParseConfig(const std::string& text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object at the top level, got ", Describe(root)));
  }
  KeyReader r(root, source, "");
  LlamaConfig cfg;
  cfg.rope_theta = kHfRopeTheta;
  cfg.rms_norm_eps = kHfRmsNormEps;
  cfg.max_position_embeddings = kHfMaxPositions;
  RETURN_IF_ERROR(r.Int("hidden_size", true, &cfg.hidden_size));
  RETURN_IF_ERROR(r.Int("intermediate_size", true, &cfg.intermediate_size));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", true, &cfg.num_hidden_layers));
  RETURN_IF_ERROR(r.Int("num_attention_heads", true, &cfg.num_attention_heads));
  RETURN_IF_ERROR(r.Int("vocab_size", true, &cfg.vocab_size));
  cfg.num_key_value_heads = cfg.num_attention_heads;
  RETURN_IF_ERROR(r.Int("num_key_value_heads", false, &cfg.num_key_value_heads));
  if (cfg.num_attention_heads <= 0) {
    return r.Error("num_attention_heads",
                   absl::StrCat("must be positive, got ", cfg.num_attention_heads));
  }
  cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  if (!r.Find("head_dim") && cfg.hidden_size % cfg.num_attention_heads != 0) {
    return r.Error("hidden_size",
                   absl::StrCat(cfg.hidden_size,
                                " is not divisible by "
                                "num_attention_heads ",
                                cfg.num_attention_heads, " (and head_dim is not given)"));
  }
  RETURN_IF_ERROR(r.Int("head_dim", false, &cfg.head_dim));
  RETURN_IF_ERROR(r.Number("rope_theta", false, &cfg.rope_theta));
  RETURN_IF_ERROR(r.Number("rms_norm_eps", false, &cfg.rms_norm_eps));
  RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &cfg.tie_word_embeddings));
  RETURN_IF_ERROR(r.Int("max_position_embeddings", false, &cfg.max_position_embeddings));
  RETURN_IF_ERROR(r.Int("bos_token_id", false, &cfg.bos_token_id));
  // Llama 3.1+ instruct configs list several end tokens; the first is the primary one.
  const Json* eos = r.Find("eos_token_id");
  if (eos && eos->is_array() && !eos->empty()) {
    Json first = Json::object();
    first["eos_token_id"] = eos->front();
    RETURN_IF_ERROR(KeyReader(first, source, "").Int("eos_token_id", true, &cfg.eos_token_id));
  } else {
    RETURN_IF_ERROR(r.Int("eos_token_id", false, &cfg.eos_token_id));
  }

  // The engine implements exactly Llama's block: SwiGLU, no biases. Loading anything else would
  // silently compute a different model.
  std::string act;
  bool present = false;
  RETURN_IF_ERROR(r.String("hidden_act", &act, &present));
  if (present && act != "silu") {
    return r.Error("hidden_act", absl::StrCat("unsupported \"", act, "\" (only \"silu\")"));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    RETURN_IF_ERROR(r.Bool(key, &bias));
    if (bias) return r.Error(key, "true is unsupported (Ithaca's Llama has no biases)");
  }

  if (cfg.head_dim > std::numeric_limits<int>::max()) {
    return r.Error("head_dim", absl::StrCat("too large, got ", cfg.head_dim));
  }
  cfg.rope.head_dim = static_cast<int>(cfg.head_dim);
  cfg.rope.theta = cfg.rope_theta;
  RETURN_IF_ERROR(ParseRopeScaling(root, source, &cfg.rope));

  absl::Status st = ValidateConfig(cfg);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", st.message()));
  return cfg;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

int64_t LlamaConfig::LayerParameters() const {
  const int64_t d = hidden_size;
  const int64_t q = num_attention_heads * head_dim * d;
  const int64_t kv = num_key_value_heads * head_dim * d;
  return q + 2 * kv + q + 3 * d * intermediate_size + 2 * d;
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
  if (cfg.rope.llama3_scaling) {
    const RopeConfig& r = cfg.rope;
    if (!(r.factor > 0) || !std::isfinite(r.factor)) {
      return bad("rope_scaling.factor", absl::StrCat("must be positive, got ", r.factor));
    }
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
    if (r.original_max_position <= 0) {
      return bad("rope_scaling.original_max_position_embeddings",
                 absl::StrCat("must be positive, got ", r.original_max_position));
    }
  }
  // Parameter counts are int64 everywhere; reject shapes whose count would overflow.
  const long double d = cfg.hidden_size, f = cfg.intermediate_size, hd = cfg.head_dim;
  const long double layer =
      (2.0L * cfg.num_attention_heads + 2.0L * cfg.num_key_value_heads) * hd * d + 3.0L * d * f +
      2.0L * d;
  const long double total = cfg.num_hidden_layers * layer + 2.0L * cfg.vocab_size * d + d;
  if (total > 4.0e18L) {
    return bad("hidden_size", "the model's shape is too large (parameter count overflows)");
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaConfig> ParseConfigJson(const std::string& json_text) {
  return ParseConfig(json_text, "config.json");
}

absl::StatusOr<LlamaConfig> LoadConfigJson(const std::string& path) {
  const std::string file = IsDirectory(path) ? path + "/config.json" : path;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(file));
  return ParseConfig(text, file);
}

std::string ConfigToJson(const LlamaConfig& cfg) {
  Json j = Json::object();  // std::map-backed: keys come out sorted, as transformers writes them
  j["architectures"] = Json::array({"LlamaForCausalLM"});
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (cfg.bos_token_id >= 0) j["bos_token_id"] = cfg.bos_token_id;
  if (cfg.eos_token_id >= 0) j["eos_token_id"] = cfg.eos_token_id;
  j["head_dim"] = cfg.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = cfg.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = cfg.intermediate_size;
  j["max_position_embeddings"] = cfg.max_position_embeddings;
  j["mlp_bias"] = false;
  j["model_type"] = "llama";
  j["num_attention_heads"] = cfg.num_attention_heads;
  j["num_hidden_layers"] = cfg.num_hidden_layers;
  j["num_key_value_heads"] = cfg.num_key_value_heads;
  j["pretraining_tp"] = 1;
  j["rms_norm_eps"] = cfg.rms_norm_eps;
  if (cfg.rope.llama3_scaling) {
    j["rope_scaling"] = {
        {"factor", cfg.rope.factor},
        {"high_freq_factor", cfg.rope.high_freq_factor},
        {"low_freq_factor", cfg.rope.low_freq_factor},
        {"original_max_position_embeddings", cfg.rope.original_max_position},
        {"rope_type", "llama3"},
    };
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rope_theta"] = cfg.rope_theta;
  j["tie_word_embeddings"] = cfg.tie_word_embeddings;
  j["torch_dtype"] = "bfloat16";
  j["use_cache"] = true;
  j["vocab_size"] = cfg.vocab_size;
  return j.dump(2) + "\n";
}

absl::StatusOr<LlamaConfig> PresetConfig(const std::string& name) {
  LlamaConfig c;
  const std::string key = absl::AsciiStrToLower(name);
  if (key == "llama-3.2-1b" || key == "llama-3.2-3b") {
    const bool small = key == "llama-3.2-1b";
    c.hidden_size = small ? 2048 : 3072;
    c.intermediate_size = 8192;
    c.num_hidden_layers = small ? 16 : 28;
    c.num_attention_heads = small ? 32 : 24;
    c.num_key_value_heads = 8;
    c.head_dim = small ? 64 : 128;
    c.vocab_size = 128256;
    c.rope_theta = 500000.0;
    c.rope.llama3_scaling = true;
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
    c.rope.llama3_scaling = false;
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
    c.rope.llama3_scaling = true;
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
    return absl::InvalidArgumentError(
        absl::StrCat("unknown model preset \"", name,
                     "\"; valid: llama-3.2-1b, llama-3.2-3b, llama-3-8b, tiny"));
  }
  c.rope.head_dim = static_cast<int>(c.head_dim);
  c.rope.theta = c.rope_theta;
  return c;
}

}  // namespace ithaca
