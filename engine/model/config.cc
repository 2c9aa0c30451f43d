// LlamaConfig <-> Hugging Face config.json, validation and parameter counts (the presets:
// presets.cc).
#include "engine/model/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "engine/core/file_util.h"

namespace ithaca {
namespace {

using Json = nlohmann::json;

// Transformers' LlamaConfig defaults, used for optional keys a config.json omits, so a file
// means here what it means to Hugging Face (these differ from LlamaConfig's member defaults).
constexpr double kHfRopeTheta = 10000.0;
constexpr double kHfRmsNormEps = 1e-6;  // the same in Qwen2Config, Qwen3Config, MistralConfig

// The configs' max_position_embeddings default (it only matters as the original context of
// llama3 and yarn RoPE when those omit it).
int64_t HfMaxPositions(ModelFamily f) {
  switch (f) {
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3:
      return 32768;
    case ModelFamily::kMistral:
      return 4096 * 32;
    case ModelFamily::kLlama:
      break;
  }
  return 2048;
}

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

// The rotary embedding as one rope object describes it: `rope_scaling` (the hub's dialect, theta
// usually at the top level) or `rope_parameters` (transformers 5, theta inside). `rope` holds the
// type and its parameters (head_dim and theta are filled in later).
struct RopeObject {
  RopeConfig rope;
  bool has_theta = false;
  double theta = 0;
};

// The keys each rope_type reads besides rope_type/type, rope_theta and partial_rotary_factor.
const std::vector<std::string>& RopeKeys(RopeType t) {
  static const std::vector<std::string> kNone,
      kLinear = {"factor"},
      kLlama3 = {"factor", "low_freq_factor", "high_freq_factor",
                 "original_max_position_embeddings"},
      kYarn = {"factor",
               "attention_factor",
               "beta_fast",
               "beta_slow",
               "mscale",
               "mscale_all_dim",
               "original_max_position_embeddings",
               "truncate"};
  switch (t) {
    case RopeType::kLinear:
      return kLinear;
    case RopeType::kLlama3:
      return kLlama3;
    case RopeType::kYarn:
      return kYarn;
    case RopeType::kDefault:
      break;
  }
  return kNone;
}

absl::Status Positive(const KeyReader& r, const char* key, double v) {
  if (!(v > 0) || !std::isfinite(v)) {
    return r.Error(key, absl::StrCat("must be positive, got ", v));
  }
  return absl::OkStatus();
}

// YaRN's mscale: 0.1 · m · ln(scale) + 1, and 1 for scale <= 1 (transformers' get_mscale).
double YarnMscale(double scale, double m) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

// Reads `root[key]` (absent or null: *out stays empty) as transformers 5 reads it: rope_type
// "default" when absent, original_max_position_embeddings = max_position_embeddings when absent.
// Every key is checked, so a rope variant Ithaca does not implement is an error rather than a
// silently different model.
absl::Status ParseRopeObject(const Json& root, const std::string& source, const char* key,
                             int64_t max_position_embeddings, std::optional<RopeObject>* out) {
  KeyReader top(root, source, "");
  const Json* obj = top.Find(key);
  if (!obj) return absl::OkStatus();
  if (!obj->is_object()) {
    return top.Error(key, absl::StrCat("expected an object or null, got ", Describe(*obj)));
  }
  KeyReader r(*obj, source, absl::StrCat(key, "."));
  RopeObject ro;
  RopeConfig& rope = ro.rope;
  std::string type, old_type;
  bool has_type = false, has_old_type = false;
  // Older configs say "type"; newer ones "rope_type" (transformers accepts both).
  RETURN_IF_ERROR(r.String("rope_type", &type, &has_type));
  RETURN_IF_ERROR(r.String("type", &old_type, &has_old_type));
  if (has_type && has_old_type && type != old_type) {
    return r.Error("type", absl::StrCat("\"", old_type, "\" contradicts rope_type \"", type, "\""));
  }
  if (!has_type) type = has_old_type ? old_type : "default";
  if (type == "default") {
    rope.type = RopeType::kDefault;
  } else if (type == "linear") {
    rope.type = RopeType::kLinear;
  } else if (type == "llama3") {
    rope.type = RopeType::kLlama3;
  } else if (type == "yarn") {
    rope.type = RopeType::kYarn;
  } else {
    return r.Error(has_type ? "rope_type" : "type",
                   absl::StrCat("unsupported \"", type,
                                "\" (Ithaca implements \"default\", \"linear\", \"llama3\" and "
                                "\"yarn\")"));
  }
  const bool has_theta = r.Find("rope_theta") != nullptr;
  RETURN_IF_ERROR(r.Number("rope_theta", false, &ro.theta));
  ro.has_theta = has_theta;
  if (r.Find("partial_rotary_factor")) {
    double partial = 1.0;
    RETURN_IF_ERROR(r.Number("partial_rotary_factor", false, &partial));
    if (partial != 1.0) {
      return r.Error("partial_rotary_factor",
                     absl::StrCat("unsupported ", partial, " (Ithaca rotates the whole head)"));
    }
  }
  const std::vector<std::string>& keys = RopeKeys(rope.type);
  for (const auto& item : obj->items()) {
    const std::string& name = item.key();
    if (name == "rope_type" || name == "type" || name == "rope_theta" ||
        name == "partial_rotary_factor") {
      continue;
    }
    // A factor under "default" (or a yarn key under "llama3") means the file asks for a rope
    // Ithaca would not compute; transformers would drop it with a warning.
    if (std::find(keys.begin(), keys.end(), name) == keys.end()) {
      return r.Error(name, absl::StrCat("not a parameter of rope_type \"", type, "\"",
                                        has_type || has_old_type ? "" : " (absent rope_type)"));
    }
  }
  rope.original_max_position = max_position_embeddings;
  switch (rope.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      RETURN_IF_ERROR(r.Number("factor", true, &rope.factor));
      RETURN_IF_ERROR(Positive(r, "factor", rope.factor));
      break;
    case RopeType::kLlama3:
      RETURN_IF_ERROR(r.Number("factor", true, &rope.factor));
      RETURN_IF_ERROR(r.Number("low_freq_factor", true, &rope.low_freq_factor));
      RETURN_IF_ERROR(r.Number("high_freq_factor", true, &rope.high_freq_factor));
      RETURN_IF_ERROR(
          r.Int("original_max_position_embeddings", false, &rope.original_max_position));
      RETURN_IF_ERROR(Positive(r, "factor", rope.factor));
      RETURN_IF_ERROR(Positive(r, "low_freq_factor", rope.low_freq_factor));
      // The smoothing interpolation divides by their difference.
      if (!(rope.high_freq_factor > rope.low_freq_factor) ||
          !std::isfinite(rope.high_freq_factor)) {
        return r.Error("high_freq_factor",
                       absl::StrCat("must exceed low_freq_factor ", rope.low_freq_factor, ", got ",
                                    rope.high_freq_factor));
      }
      break;
    case RopeType::kYarn: {
      RETURN_IF_ERROR(r.Number("factor", true, &rope.factor));
      RETURN_IF_ERROR(Positive(r, "factor", rope.factor));
      RETURN_IF_ERROR(
          r.Int("original_max_position_embeddings", false, &rope.original_max_position));
      // transformers: `get("beta_fast") or 32`, so 0 (like absent) means the default.
      double beta_fast = 0, beta_slow = 0;
      RETURN_IF_ERROR(r.Number("beta_fast", false, &beta_fast));
      RETURN_IF_ERROR(r.Number("beta_slow", false, &beta_slow));
      rope.beta_fast = beta_fast != 0 ? beta_fast : 32.0;
      rope.beta_slow = beta_slow != 0 ? beta_slow : 1.0;
      RETURN_IF_ERROR(Positive(r, "beta_fast", rope.beta_fast));
      RETURN_IF_ERROR(Positive(r, "beta_slow", rope.beta_slow));
      RETURN_IF_ERROR(r.Bool("truncate", &rope.truncate));
      // The attention factor: explicit, else mscale / mscale_all_dim when both are set (and not
      // 0), else 0.1 · ln(factor) + 1.
      if (r.Find("attention_factor")) {
        RETURN_IF_ERROR(r.Number("attention_factor", true, &rope.attention_factor));
        RETURN_IF_ERROR(Positive(r, "attention_factor", rope.attention_factor));
      } else {
        double mscale = 0, mscale_all_dim = 0;
        RETURN_IF_ERROR(r.Number("mscale", false, &mscale));
        RETURN_IF_ERROR(r.Number("mscale_all_dim", false, &mscale_all_dim));
        rope.attention_factor =
            mscale != 0 && mscale_all_dim != 0
                ? YarnMscale(rope.factor, mscale) / YarnMscale(rope.factor, mscale_all_dim)
                : YarnMscale(rope.factor, 1.0);
        if (!(rope.attention_factor > 0) || !std::isfinite(rope.attention_factor)) {
          return r.Error("mscale", absl::StrCat("gives an attention factor of ",
                                                rope.attention_factor, " (must be positive)"));
        }
      }
      break;
    }
  }
  if (rope.original_max_position <= 0) {
    return r.Error("original_max_position_embeddings",
                   absl::StrCat("must be positive, got ", rope.original_max_position));
  }
  *out = ro;
  return absl::OkStatus();
}

std::string DescribeRope(const RopeConfig& r) {
  switch (r.type) {
    case RopeType::kDefault:
      return "rope_type default";
    case RopeType::kLinear:
      return absl::StrCat("linear factor ", r.factor);
    case RopeType::kLlama3:
      return absl::StrCat("llama3 factor ", r.factor, ", low_freq_factor ", r.low_freq_factor,
                          ", high_freq_factor ", r.high_freq_factor,
                          ", original_max_position_embeddings ", r.original_max_position);
    case RopeType::kYarn:
      return absl::StrCat("yarn factor ", r.factor, ", attention_factor ", r.attention_factor,
                          ", beta_fast ", r.beta_fast, ", beta_slow ", r.beta_slow,
                          ", original_max_position_embeddings ", r.original_max_position,
                          ", truncate ", r.truncate ? "true" : "false");
  }
  return "?";
}

// The same rotary embedding (type and the parameters that type reads).
bool SameRope(const RopeConfig& a, const RopeConfig& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case RopeType::kDefault:
      return true;
    case RopeType::kLinear:
      return a.factor == b.factor;
    case RopeType::kLlama3:
      return a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
             a.high_freq_factor == b.high_freq_factor &&
             a.original_max_position == b.original_max_position;
    case RopeType::kYarn:
      return a.factor == b.factor && a.attention_factor == b.attention_factor &&
             a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow &&
             a.original_max_position == b.original_max_position && a.truncate == b.truncate;
  }
  return false;
}

// Fills cfg->rope_theta and cfg->rope from either dialect. Where a file states a value twice
// (rope_theta at the top level and inside the rope object; both rope objects), the statements
// must agree: picking one silently could train a model the file's author did not mean.
absl::Status ParseRope(const Json& root, const std::string& source, LlamaConfig* cfg) {
  KeyReader top(root, source, "");
  std::optional<RopeObject> scaling, params;
  const int64_t max_pos = cfg->max_position_embeddings;
  RETURN_IF_ERROR(ParseRopeObject(root, source, "rope_scaling", max_pos, &scaling));
  RETURN_IF_ERROR(ParseRopeObject(root, source, "rope_parameters", max_pos, &params));

  const char* theta_key = nullptr;
  auto take_theta = [&](const char* key, double value) -> absl::Status {
    if (theta_key && value != cfg->rope_theta) {
      return top.Error(key, absl::StrCat(value, " contradicts ", theta_key, " ", cfg->rope_theta));
    }
    theta_key = key;
    cfg->rope_theta = value;
    return absl::OkStatus();
  };
  if (top.Find("rope_theta")) {
    double theta = 0;
    RETURN_IF_ERROR(top.Number("rope_theta", true, &theta));
    RETURN_IF_ERROR(take_theta("rope_theta", theta));
  }
  if (scaling && scaling->has_theta) {
    RETURN_IF_ERROR(take_theta("rope_scaling.rope_theta", scaling->theta));
  }
  if (params && params->has_theta) {
    RETURN_IF_ERROR(take_theta("rope_parameters.rope_theta", params->theta));
  }

  if (scaling && params && !SameRope(scaling->rope, params->rope)) {
    return top.Error("rope_parameters",
                     absl::StrCat("(", DescribeRope(params->rope), ") contradicts rope_scaling (",
                                  DescribeRope(scaling->rope), ")"));
  }
  const std::optional<RopeObject>& rope = params ? params : scaling;
  const int head_dim = cfg->rope.head_dim;
  cfg->rope = rope ? rope->rope : RopeConfig();
  cfg->rope.head_dim = head_dim;
  cfg->rope.theta = cfg->rope_theta;
  if (!rope) cfg->rope.original_max_position = max_pos;
  return absl::OkStatus();
}

// Top-level keys read above: their values are checked.
constexpr const char* kModelKeys[] = {
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "num_key_value_heads",
    "head_dim",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "rms_norm_eps",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "max_position_embeddings",
    "hidden_act",
    "attention_bias",
    "mlp_bias",
    "model_type",
    "sliding_window",
    "attention_dropout",
    "pretraining_tp",
    // Qwen2 / Qwen3: the sliding window's switch and its per-layer extent, transformers 5's
    // per-layer attention kinds, and Qwen2-VL's multimodal RoPE switch.
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "use_mrope",
};

// Top-level keys that do not change the model Ithaca computes from the weights: metadata,
// storage dtype, inference and generation settings, task heads' labels, and the attributes every
// transformers config carries. Anything else is rejected, since Ithaca cannot tell whether an
// unknown key changes the model. initializer_range only shapes a fresh initialization.
constexpr const char* kHarmlessKeys[] = {
    "architectures",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "use_cache",
    "pad_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "initializer_range",
    // PretrainedConfig's common attributes.
    "return_dict",
    "output_hidden_states",
    "output_attentions",
    "torchscript",
    "is_decoder",
    "is_encoder_decoder",
    "add_cross_attention",
    "tie_encoder_decoder",
    "cross_attention_hidden_size",
    "chunk_size_feed_forward",
    "id2label",
    "label2id",
    "num_labels",
    "problem_type",
    "finetuning_task",
    "tokenizer_class",
    "prefix",
    "task_specific_params",
    "tf_legacy_loss",
    "use_bfloat16",
    // Generation defaults older transformers kept in config.json.
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "num_beam_groups",
    "diversity_penalty",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "output_scores",
    "return_dict_in_generate",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
};

// The family's architecture keys: `model_type` (absent: llama), biases, attention kinds, the
// sliding window. Fills cfg->family, qkv_bias, qk_norm and sliding_window. Rejects values that
// would make this a model other than the family's as Ithaca builds it (SwiGLU, no dropout, full
// causal or Mistral's window) and every key it does not know.
absl::Status CheckModelKeys(const Json& root, const std::string& source, LlamaConfig* cfg) {
  KeyReader r(root, source, "");
  std::string text;
  bool present = false;
  RETURN_IF_ERROR(r.String("model_type", &text, &present));
  if (!present || text == "llama") {
    cfg->family = ModelFamily::kLlama;
  } else if (text == "qwen2") {
    cfg->family = ModelFamily::kQwen2;
  } else if (text == "qwen3") {
    cfg->family = ModelFamily::kQwen3;
  } else if (text == "mistral") {
    cfg->family = ModelFamily::kMistral;
  } else {
    return r.Error("model_type",
                   absl::StrCat("unsupported \"", text,
                                "\" (Ithaca implements \"llama\", \"qwen2\", \"qwen3\" and "
                                "\"mistral\")"));
  }
  const ModelFamily family = cfg->family;
  const std::string family_name = ModelTypeName(family);
  cfg->qkv_bias = family == ModelFamily::kQwen2;
  cfg->qk_norm = family == ModelFamily::kQwen3;
  RETURN_IF_ERROR(r.String("hidden_act", &text, &present));
  // transformers maps "swish" to the same SiLU.
  if (present && text != "silu" && text != "swish") {
    return r.Error("hidden_act", absl::StrCat("unsupported \"", text, "\" (only \"silu\")"));
  }
  // Llama's and Qwen3's attention_bias puts biases on all four projections (o_proj's Ithaca does
  // not implement); Qwen2's q/k/v biases are built in and its modeling code never reads the key.
  if (family != ModelFamily::kQwen2) {
    bool bias = false;
    RETURN_IF_ERROR(r.Bool("attention_bias", &bias));
    if (bias) {
      return r.Error("attention_bias",
                     absl::StrCat("true is unsupported (", family_name,
                                  " with biases on q, k, v and o; Ithaca implements q/k/v "
                                  "biases as Qwen2 has them)"));
    }
  }
  bool mlp_bias = false;
  RETURN_IF_ERROR(r.Bool("mlp_bias", &mlp_bias));
  if (mlp_bias) return r.Error("mlp_bias", "true is unsupported (Ithaca's MLP has no biases)");
  bool mrope = false;
  RETURN_IF_ERROR(r.Bool("use_mrope", &mrope));
  if (mrope) return r.Error("use_mrope", "true is unsupported (multimodal RoPE)");

  // Sliding windows. Mistral's `sliding_window` is the window itself (null: none), on every
  // layer. Qwen2/Qwen3 apply theirs only with use_sliding_window true, to the layers from
  // max_window_layers on (transformers' defaults: a window of 4096, max_window_layers 28); with
  // it false transformers ignores both keys. Llama has none.
  if (family == ModelFamily::kQwen2 || family == ModelFamily::kQwen3) {
    bool use_window = false;
    RETURN_IF_ERROR(r.Bool("use_sliding_window", &use_window));
    int64_t window = 4096, first = 28;
    // (KeyReader::Find treats null as absent; here null is "no window", absent the default.)
    const bool null_window = root.contains("sliding_window") && root["sliding_window"].is_null();
    RETURN_IF_ERROR(r.Int("sliding_window", false, &window));
    RETURN_IF_ERROR(r.Int("max_window_layers", false, &first));
    if (use_window) {
      if (null_window) {
        window = 0;  // transformers: no window on any layer
      } else if (window <= 0) {
        return r.Error("sliding_window", absl::StrCat("must be positive or null, got ", window));
      }
      if (first < 0) {
        return r.Error("max_window_layers", absl::StrCat("must be >= 0, got ", first));
      }
      // A window no layer uses (max_window_layers >= num_hidden_layers) is no window.
      int64_t layers = 0;
      RETURN_IF_ERROR(r.Int("num_hidden_layers", false, &layers));
      if (window > 0 && first < layers) {
        cfg->sliding_window = window;
        cfg->window_first_layer = first;
      }
    }
  } else {
    for (const char* key : {"use_sliding_window", "max_window_layers"}) {
      if (r.Find(key)) {
        return r.Error(key, absl::StrCat("not a key of model_type \"", family_name, "\""));
      }
    }
    if (family == ModelFamily::kMistral) {
      RETURN_IF_ERROR(r.Int("sliding_window", false, &cfg->sliding_window));
      if (r.Find("sliding_window") && cfg->sliding_window <= 0) {
        return r.Error("sliding_window",
                       absl::StrCat("must be positive or null, got ", cfg->sliding_window));
      }
    } else if (const Json* window = r.Find("sliding_window")) {
      return r.Error("sliding_window",
                     absl::StrCat("unsupported ", Describe(*window),
                                  " (Llama's attention is full causal; only null is accepted; "
                                  "model_type \"mistral\" has a sliding window)"));
    }
  }
  // transformers 5 lists each layer's attention kind: it must be the one the keys above give
  // that layer.
  if (const Json* kinds = r.Find("layer_types")) {
    if (!kinds->is_array()) {
      return r.Error("layer_types", absl::StrCat("expected an array, got ", Describe(*kinds)));
    }
    int64_t layers = 0;
    RETURN_IF_ERROR(r.Int("num_hidden_layers", false, &layers));
    if (layers > 0 && static_cast<int64_t>(kinds->size()) != layers) {
      return r.Error("layer_types", absl::StrCat(kinds->size(), " entries for ", layers,
                                                 " layers (num_hidden_layers): one per layer"));
    }
    for (size_t i = 0; i < kinds->size(); ++i) {
      const Json& kind = (*kinds)[i];
      const char* want =
          cfg->LayerWindow(static_cast<int64_t>(i)) > 0 ? "sliding_attention" : "full_attention";
      if (!kind.is_string() || kind.get<std::string>() != want) {
        return r.Error(absl::StrCat("layer_types[", i, "]"),
                       absl::StrCat("unsupported ", Describe(kind),
                                    " (the sliding_window, "
                                    "use_sliding_window and max_window_layers keys make layer ",
                                    i, " \"", want, "\")"));
      }
    }
  }
  double dropout = 0;
  RETURN_IF_ERROR(r.Number("attention_dropout", false, &dropout));
  if (dropout != 0) {
    return r.Error("attention_dropout",
                   absl::StrCat("unsupported ", dropout, " (Ithaca has no dropout; only 0)"));
  }
  // transformers' pretraining_tp only split matmuls into slices: the same product.
  int64_t tp = 1;
  RETURN_IF_ERROR(r.Int("pretraining_tp", false, &tp));

  for (const auto& item : root.items()) {
    const std::string& key = item.key();
    // "_name_or_path", "_attn_implementation", ...: transformers' private bookkeeping.
    if (!key.empty() && key[0] == '_') continue;
    auto known = [&key](const auto& list) {
      for (const char* k : list) {
        if (key == k) return true;
      }
      return false;
    };
    if (known(kModelKeys) || known(kHarmlessKeys)) continue;
    return r.Error(key, absl::StrCat("unknown key; Ithaca implements ", family_name,
                                     " as transformers does and cannot tell whether this key "
                                     "changes the model (remove it from the file if it does "
                                     "not)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaConfig> ParseConfig(const std::string& text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(text);
  } catch (const Json::parse_error& e) {
    // The parser's own message quotes the bytes it read: a spec may name any file, and the
    // error must not hand its content to whoever submitted the spec.
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": not a JSON object (parse error at byte ", e.byte > 0 ? e.byte - 1 : 0, ")"));
  } catch (const Json::exception&) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object (invalid JSON)"));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object (the top level is ",
                                                   root.is_array() ? "an " : "a ", root.type_name(),
                                                   ")"));
  }
  LlamaConfig cfg;
  RETURN_IF_ERROR(CheckModelKeys(root, source, &cfg));
  KeyReader r(root, source, "");
  cfg.rope_theta = kHfRopeTheta;
  cfg.rms_norm_eps = kHfRmsNormEps;
  cfg.max_position_embeddings = HfMaxPositions(cfg.family);
  RETURN_IF_ERROR(r.Int("hidden_size", true, &cfg.hidden_size));
  RETURN_IF_ERROR(r.Int("intermediate_size", true, &cfg.intermediate_size));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", true, &cfg.num_hidden_layers));
  RETURN_IF_ERROR(r.Int("num_attention_heads", true, &cfg.num_attention_heads));
  RETURN_IF_ERROR(r.Int("vocab_size", true, &cfg.vocab_size));
  cfg.num_key_value_heads = cfg.num_attention_heads;
  // Qwen2's, Qwen3's and Mistral's configs default to 32 or 8 KV heads rather than MHA: a file
  // that omits the key is more likely a mistake than meant, so those families need it stated.
  RETURN_IF_ERROR(
      r.Int("num_key_value_heads", cfg.family != ModelFamily::kLlama, &cfg.num_key_value_heads));
  if (cfg.num_attention_heads <= 0) {
    return r.Error("num_attention_heads",
                   absl::StrCat("must be positive, got ", cfg.num_attention_heads));
  }
  cfg.head_dim = cfg.hidden_size / cfg.num_attention_heads;
  // Qwen3Config defaults head_dim to 128 whatever the hidden size: every Qwen3 config states it.
  if (cfg.family == ModelFamily::kQwen3 && !r.Find("head_dim")) {
    return r.Error("head_dim", "missing (required for qwen3)");
  }
  if (!r.Find("head_dim") && cfg.hidden_size % cfg.num_attention_heads != 0) {
    return r.Error("hidden_size",
                   absl::StrCat(cfg.hidden_size,
                                " is not divisible by "
                                "num_attention_heads ",
                                cfg.num_attention_heads, " (and head_dim is not given)"));
  }
  RETURN_IF_ERROR(r.Int("head_dim", false, &cfg.head_dim));
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
  // Token ids name rows of the embedding: inside the vocabulary (a packed sample's documents are
  // found by bos_token_id).
  for (auto [name, id] : {std::pair<const char*, int64_t>{"bos_token_id", cfg.bos_token_id},
                          {"eos_token_id", cfg.eos_token_id}}) {
    if (id >= cfg.vocab_size && cfg.vocab_size > 0) {
      return r.Error(name, absl::StrCat(id, " is not below vocab_size (", cfg.vocab_size, ")"));
    }
  }

  if (cfg.head_dim > std::numeric_limits<int>::max()) {
    return r.Error("head_dim", absl::StrCat("too large, got ", cfg.head_dim));
  }
  cfg.rope.head_dim = static_cast<int>(cfg.head_dim);
  RETURN_IF_ERROR(ParseRope(root, source, &cfg));

  absl::Status st = ValidateConfig(cfg);
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat(source, ": ", st.message()));
  return cfg;
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

const char* ModelTypeName(ModelFamily f) {
  switch (f) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kQwen3:
      return "qwen3";
    case ModelFamily::kMistral:
      return "mistral";
  }
  return "?";
}

int64_t LlamaConfig::LayerParameters() const {
  const int64_t d = hidden_size;
  const int64_t q = num_attention_heads * head_dim * d;
  const int64_t kv = num_key_value_heads * head_dim * d;
  const int64_t biases = qkv_bias ? (num_attention_heads + 2 * num_key_value_heads) * head_dim : 0;
  const int64_t qk_norms = qk_norm ? 2 * head_dim : 0;
  return q + 2 * kv + q + 3 * d * intermediate_size + 2 * d + biases + qk_norms;
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
    // Far above any real Llama, and low enough that no size computed from them overflows: a
    // config.json is untrusted input that reaches the planner inside the daemon.
    // One bound per key, so every message names the same one (layers have their own).
    const int64_t max = std::string(key) == "num_hidden_layers" ? kMaxLayers : kMaxConfigSize;
    if (value > max) return bad(key, absl::StrCat("must be at most ", max, ", got ", value));
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
  // The family's architecture, as ParseConfigJson and the presets set it.
  const bool qwen2 = cfg.family == ModelFamily::kQwen2, qwen3 = cfg.family == ModelFamily::kQwen3;
  if (cfg.qkv_bias != qwen2) {
    return bad("qkv_bias", absl::StrCat(cfg.qkv_bias, " does not match model_type ",
                                        ModelTypeName(cfg.family), " (only qwen2 has them)"));
  }
  if (cfg.qk_norm != qwen3) {
    return bad("qk_norm", absl::StrCat(cfg.qk_norm, " does not match model_type ",
                                       ModelTypeName(cfg.family), " (only qwen3 has them)"));
  }
  if (cfg.sliding_window < 0 || cfg.sliding_window > kMaxConfigSize ||
      (cfg.sliding_window > 0 && cfg.family == ModelFamily::kLlama)) {
    return bad("sliding_window",
               absl::StrCat(cfg.sliding_window, " is not a window of model_type ",
                            ModelTypeName(cfg.family), " (mistral, qwen2, qwen3: positive up to ",
                            kMaxConfigSize, ", or 0 for none)"));
  }
  // Mistral windows every layer; Qwen2/Qwen3 from a layer that exists.
  const bool window_layers_ok =
      cfg.family == ModelFamily::kMistral || cfg.sliding_window == 0
          ? cfg.window_first_layer == 0
          : cfg.window_first_layer >= 0 && cfg.window_first_layer < cfg.num_hidden_layers;
  if (!window_layers_ok) {
    return bad(
        "window_first_layer",
        absl::StrCat(cfg.window_first_layer, " with a sliding_window of ", cfg.sliding_window,
                     " in ", cfg.num_hidden_layers, " layers of ", ModelTypeName(cfg.family)));
  }
  // Qwen2's attention derives head_dim from hidden_size (older transformers ignore the key).
  if (qwen2 && cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size) {
    return bad("head_dim", absl::StrCat(cfg.head_dim, " is not hidden_size / num_attention_heads ",
                                        cfg.hidden_size, " / ", cfg.num_attention_heads,
                                        " (qwen2 has no head_dim of its own)"));
  }
  const RopeConfig& r = cfg.rope;
  if (r.type != RopeType::kDefault) {
    if (!(r.factor > 0) || !std::isfinite(r.factor)) {
      return bad("rope_scaling.factor", absl::StrCat("must be positive, got ", r.factor));
    }
    if (r.original_max_position <= 0) {
      return bad("rope_scaling.original_max_position_embeddings",
                 absl::StrCat("must be positive, got ", r.original_max_position));
    }
  }
  if (r.type == RopeType::kYarn) {
    for (const auto& [key, v] :
         {std::pair<const char*, double>{"attention_factor", r.attention_factor},
          {"beta_fast", r.beta_fast},
          {"beta_slow", r.beta_slow}}) {
      if (!(v > 0) || !std::isfinite(v)) {
        return bad(absl::StrCat("rope_scaling.", key), absl::StrCat("must be positive, got ", v));
      }
    }
  }
  if (r.type == RopeType::kLlama3) {
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
  }
  // Parameter counts are int64 everywhere, and the planner sizes buffers from them: refuse
  // shapes far beyond any real model before anything overflows or allocates.
  const long double d = cfg.hidden_size, f = cfg.intermediate_size, hd = cfg.head_dim;
  const long double layer =
      (2.0L * cfg.num_attention_heads + 2.0L * cfg.num_key_value_heads) * hd * d + 3.0L * d * f +
      2.0L * d;
  const long double total = cfg.num_hidden_layers * layer + 2.0L * cfg.vocab_size * d + d;
  if (total > kMaxParameters) {
    return bad("hidden_size",
               absl::StrFormat("the model's shape is too large: %.3Lg parameters, at most %.3g",
                               total, kMaxParameters));
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaConfig> ParseConfigJson(const std::string& json_text) {
  return ParseConfig(json_text, "config.json");
}

absl::StatusOr<LlamaConfig> LoadConfigJson(const std::string& path) {
  const std::string file = IsDirectory(path) ? path + "/config.json" : path;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(file, kMaxJsonConfigBytes));
  return ParseConfig(text, file);
}

namespace {

// The rope object transformers reads back as `cfg.rope` (null for the default rope).
Json RopeJson(const RopeConfig& r) {
  switch (r.type) {
    case RopeType::kDefault:
      return nullptr;
    case RopeType::kLinear:
      return {{"factor", r.factor}, {"rope_type", "linear"}};
    case RopeType::kLlama3:
      return {
          {"factor", r.factor},
          {"high_freq_factor", r.high_freq_factor},
          {"low_freq_factor", r.low_freq_factor},
          {"original_max_position_embeddings", r.original_max_position},
          {"rope_type", "llama3"},
      };
    case RopeType::kYarn:
      // The resolved attention factor is written out, so no mscale rule is needed to read it.
      return {
          {"attention_factor", r.attention_factor},
          {"beta_fast", r.beta_fast},
          {"beta_slow", r.beta_slow},
          {"factor", r.factor},
          {"original_max_position_embeddings", r.original_max_position},
          {"rope_type", "yarn"},
          {"truncate", r.truncate},
      };
  }
  return nullptr;
}

const char* Architecture(ModelFamily f) {
  switch (f) {
    case ModelFamily::kQwen2:
      return "Qwen2ForCausalLM";
    case ModelFamily::kQwen3:
      return "Qwen3ForCausalLM";
    case ModelFamily::kMistral:
      return "MistralForCausalLM";
    case ModelFamily::kLlama:
      break;
  }
  return "LlamaForCausalLM";
}

}  // namespace

std::string ConfigToJson(const LlamaConfig& cfg) {
  Json j = Json::object();  // std::map-backed: keys come out sorted, as transformers writes them
  const ModelFamily f = cfg.family;
  j["architectures"] = Json::array({Architecture(f)});
  if (f == ModelFamily::kLlama || f == ModelFamily::kQwen3) j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (cfg.bos_token_id >= 0) j["bos_token_id"] = cfg.bos_token_id;
  if (cfg.eos_token_id >= 0) j["eos_token_id"] = cfg.eos_token_id;
  if (f != ModelFamily::kQwen2) j["head_dim"] = cfg.head_dim;
  j["hidden_act"] = "silu";
  j["hidden_size"] = cfg.hidden_size;
  j["initializer_range"] = 0.02;
  j["intermediate_size"] = cfg.intermediate_size;
  j["max_position_embeddings"] = cfg.max_position_embeddings;
  if (f == ModelFamily::kLlama) {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j["model_type"] = ModelTypeName(f);
  j["num_attention_heads"] = cfg.num_attention_heads;
  j["num_hidden_layers"] = cfg.num_hidden_layers;
  j["num_key_value_heads"] = cfg.num_key_value_heads;
  j["rms_norm_eps"] = cfg.rms_norm_eps;
  j["rope_scaling"] = RopeJson(cfg.rope);
  j["rope_theta"] = cfg.rope_theta;
  if (f == ModelFamily::kQwen2 || f == ModelFamily::kQwen3) {
    const bool window = cfg.sliding_window > 0;
    j["max_window_layers"] = window ? cfg.window_first_layer : cfg.num_hidden_layers;
    j["sliding_window"] = window ? Json(cfg.sliding_window) : Json(nullptr);
    j["use_sliding_window"] = window;
  }
  if (f == ModelFamily::kMistral) {
    j["sliding_window"] = cfg.sliding_window > 0 ? Json(cfg.sliding_window) : Json(nullptr);
  }
  j["tie_word_embeddings"] = cfg.tie_word_embeddings;
  j["torch_dtype"] = "bfloat16";
  j["use_cache"] = true;
  j["vocab_size"] = cfg.vocab_size;
  return j.dump(2) + "\n";
}

std::string DescribeModelRope(const LlamaConfig& cfg) {
  return absl::StrCat("rope_theta ", cfg.rope_theta, ", ", DescribeRope(cfg.rope));
}

bool SameModelRope(const LlamaConfig& a, const LlamaConfig& b) {
  return a.rope_theta == b.rope_theta && SameRope(a.rope, b.rope);
}

double YarnDefaultAttentionFactor(double factor) { return YarnMscale(factor, 1.0); }

}  // namespace ithaca
