// LlamaConfig <-> Hugging Face config.json: the family's keys, the shape, the special tokens
// and (rope_json.cc) the rotary embedding; written back in the family's own layout.
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "engine/model/config_json_internal.h"

namespace ithaca {
namespace config_internal {

// A short description of a JSON value for error messages; containers are not dumped, so a
// hostile file cannot make the message (or the recursion printing it) large.
std::string Describe(const Json& v) {
  if (v.is_object() || v.is_array()) return std::string("an ") + v.type_name();
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return absl::StrCat(v.type_name(), " ", s);
}

namespace {

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
  if (!present) {
    cfg->family = ModelFamily::kLlama;
  } else if (std::optional<ModelFamily> family = ValueOf(kModelTypeNames, text)) {
    cfg->family = *family;
  } else {
    return r.Error("model_type", absl::StrCat("unsupported \"", text, "\" (Ithaca implements ",
                                              NamesText(kModelTypeNames, " and ", "\""), ")"));
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
}  // namespace config_internal

using config_internal::Architecture;
using config_internal::IsDirectory;
using config_internal::Json;
using config_internal::ParseConfig;
using config_internal::RopeJson;

absl::StatusOr<LlamaConfig> ParseConfigJson(const std::string& json_text) {
  return ParseConfig(json_text, "config.json");
}

absl::StatusOr<LlamaConfig> LoadConfigJson(const std::string& path) {
  const std::string file = IsDirectory(path) ? path + "/config.json" : path;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(file, kMaxJsonConfigBytes));
  return ParseConfig(text, file);
}

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

}  // namespace ithaca
