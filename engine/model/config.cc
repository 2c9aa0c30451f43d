// LlamaConfig <-> Hugging Face config.json, validation, parameter counts and presets.
#include "engine/model/config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
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

// The rotary embedding as one rope object describes it: `rope_scaling` (the hub's dialect, theta
// usually at the top level) or `rope_parameters` (transformers 5, theta inside).
struct RopeObject {
  bool llama3 = false;
  double factor = 0, low_freq_factor = 0, high_freq_factor = 0;
  int64_t original_max_position = 0;
  bool has_theta = false;
  double theta = 0;
};

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
  RopeObject rope;
  std::string type, old_type;
  bool has_type = false, has_old_type = false;
  // Older configs say "type"; newer ones "rope_type" (transformers accepts both).
  RETURN_IF_ERROR(r.String("rope_type", &type, &has_type));
  RETURN_IF_ERROR(r.String("type", &old_type, &has_old_type));
  if (has_type && has_old_type && type != old_type) {
    return r.Error("type", absl::StrCat("\"", old_type, "\" contradicts rope_type \"", type, "\""));
  }
  if (!has_type) type = has_old_type ? old_type : "default";
  if (type != "default" && type != "llama3") {
    return r.Error("rope_type", absl::StrCat("unsupported \"", type,
                                             "\" (Ithaca implements \"default\" and \"llama3\")"));
  }
  rope.llama3 = type == "llama3";
  const bool has_theta = r.Find("rope_theta") != nullptr;
  RETURN_IF_ERROR(r.Number("rope_theta", false, &rope.theta));
  rope.has_theta = has_theta;
  if (r.Find("partial_rotary_factor")) {
    double partial = 1.0;
    RETURN_IF_ERROR(r.Number("partial_rotary_factor", false, &partial));
    if (partial != 1.0) {
      return r.Error("partial_rotary_factor",
                     absl::StrCat("unsupported ", partial, " (Ithaca rotates the whole head)"));
    }
  }
  static const char* const kLlama3Keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                            "original_max_position_embeddings"};
  for (const auto& item : obj->items()) {
    const std::string& name = item.key();
    if (name == "rope_type" || name == "type" || name == "rope_theta" ||
        name == "partial_rotary_factor") {
      continue;
    }
    const bool llama3_key =
        std::find(std::begin(kLlama3Keys), std::end(kLlama3Keys), name) != std::end(kLlama3Keys);
    // A factor under "default" (or a yarn/longrope key under "llama3") means the file asks for
    // a rope Ithaca would not compute; transformers would drop it with a warning.
    if (!llama3_key || !rope.llama3) {
      return r.Error(name, absl::StrCat("not a parameter of rope_type \"", type, "\"",
                                        has_type || has_old_type ? "" : " (absent rope_type)"));
    }
  }
  if (rope.llama3) {
    RETURN_IF_ERROR(r.Number("factor", true, &rope.factor));
    RETURN_IF_ERROR(r.Number("low_freq_factor", true, &rope.low_freq_factor));
    RETURN_IF_ERROR(r.Number("high_freq_factor", true, &rope.high_freq_factor));
    rope.original_max_position = max_position_embeddings;
    RETURN_IF_ERROR(r.Int("original_max_position_embeddings", false, &rope.original_max_position));
    if (!(rope.factor > 0) || !std::isfinite(rope.factor)) {
      return r.Error("factor", absl::StrCat("must be positive, got ", rope.factor));
    }
    if (!(rope.low_freq_factor > 0) || !std::isfinite(rope.low_freq_factor)) {
      return r.Error("low_freq_factor",
                     absl::StrCat("must be positive, got ", rope.low_freq_factor));
    }
    // The smoothing interpolation divides by their difference.
    if (!(rope.high_freq_factor > rope.low_freq_factor) || !std::isfinite(rope.high_freq_factor)) {
      return r.Error("high_freq_factor",
                     absl::StrCat("must exceed low_freq_factor ", rope.low_freq_factor, ", got ",
                                  rope.high_freq_factor));
    }
    if (rope.original_max_position <= 0) {
      return r.Error("original_max_position_embeddings",
                     absl::StrCat("must be positive, got ", rope.original_max_position));
    }
  }
  *out = rope;
  return absl::OkStatus();
}

std::string DescribeRope(const RopeObject& r) {
  if (!r.llama3) return "rope_type default";
  return absl::StrCat("llama3 factor ", r.factor, ", low_freq_factor ", r.low_freq_factor,
                      ", high_freq_factor ", r.high_freq_factor,
                      ", original_max_position_embeddings ", r.original_max_position);
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

  if (scaling && params &&
      (scaling->llama3 != params->llama3 ||
       (scaling->llama3 &&
        (scaling->factor != params->factor || scaling->low_freq_factor != params->low_freq_factor ||
         scaling->high_freq_factor != params->high_freq_factor ||
         scaling->original_max_position != params->original_max_position)))) {
    return top.Error("rope_parameters",
                     absl::StrCat("(", DescribeRope(*params), ") contradicts rope_scaling (",
                                  DescribeRope(*scaling), ")"));
  }
  const std::optional<RopeObject>& rope = params ? params : scaling;
  RopeConfig& out = cfg->rope;
  out.theta = cfg->rope_theta;
  out.llama3_scaling = rope && rope->llama3;
  if (out.llama3_scaling) {
    out.factor = rope->factor;
    out.low_freq_factor = rope->low_freq_factor;
    out.high_freq_factor = rope->high_freq_factor;
    out.original_max_position = rope->original_max_position;
  }
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

// Rejects keys that would make this a model other than Ithaca's Llama: SwiGLU, no biases, full
// causal attention without dropout, and every key it does not know.
absl::Status CheckModelKeys(const Json& root, const std::string& source) {
  KeyReader r(root, source, "");
  std::string text;
  bool present = false;
  RETURN_IF_ERROR(r.String("model_type", &text, &present));
  if (present && text != "llama") {
    return r.Error("model_type", absl::StrCat("unsupported \"", text, "\" (only \"llama\")"));
  }
  RETURN_IF_ERROR(r.String("hidden_act", &text, &present));
  // transformers maps "swish" to the same SiLU.
  if (present && text != "silu" && text != "swish") {
    return r.Error("hidden_act", absl::StrCat("unsupported \"", text, "\" (only \"silu\")"));
  }
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    bool bias = false;
    RETURN_IF_ERROR(r.Bool(key, &bias));
    if (bias) return r.Error(key, "true is unsupported (Ithaca's Llama has no biases)");
  }
  if (const Json* window = r.Find("sliding_window")) {
    return r.Error("sliding_window", absl::StrCat("unsupported ", Describe(*window),
                                                  " (Ithaca's attention is full causal; only "
                                                  "null is accepted)"));
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
    return r.Error(key,
                   "unknown key; Ithaca implements the plain Llama and cannot tell whether this "
                   "key changes the model (remove it from the file if it does not)");
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
  RETURN_IF_ERROR(CheckModelKeys(root, source));
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
    // Far above any real Llama, and low enough that no size computed from them overflows: a
    // config.json is untrusted input that reaches the planner inside the daemon.
    if (value > kMaxConfigSize) {
      return bad(key, absl::StrCat("must be at most ", kMaxConfigSize, ", got ", value));
    }
  }
  if (cfg.num_hidden_layers > kMaxLayers) {
    return bad("num_hidden_layers",
               absl::StrCat("must be at most ", kMaxLayers, ", got ", cfg.num_hidden_layers));
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

const std::vector<std::string>& PresetNames() {
  static const auto* names =
      new std::vector<std::string>{"tiny", "llama-3.2-1b", "llama-3.2-3b", "llama-3-8b"};
  return *names;
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
        absl::StrCat("unknown model preset \"", name, "\"; valid: ", absl::StrJoin(PresetNames(), ", ")));
  }
  c.rope.head_dim = static_cast<int>(c.head_dim);
  c.rope.theta = c.rope_theta;
  return c;
}

}  // namespace ithaca
