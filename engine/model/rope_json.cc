// The rotary embedding in config.json: rope_scaling (the hub's dialect) and rope_parameters
// (transformers 5) read into RopeConfig, written back, and described in words.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "engine/model/config_json_internal.h"

namespace ithaca {
namespace config_internal {
namespace {

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
  if (std::optional<RopeType> t = ValueOf(kRopeTypeNames, type)) {
    rope.type = *t;
  } else {
    return r.Error(has_type ? "rope_type" : "type",
                   absl::StrCat("unsupported \"", type, "\" (Ithaca implements ",
                                NamesText(kRopeTypeNames, " and ", "\""), ")"));
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

}  // namespace

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

}  // namespace config_internal

using config_internal::DescribeRope;
using config_internal::SameRope;
using config_internal::YarnMscale;

std::string DescribeModelRope(const LlamaConfig& cfg) {
  return absl::StrCat("rope_theta ", cfg.rope_theta, ", ", DescribeRope(cfg.rope));
}

bool SameModelRope(const LlamaConfig& a, const LlamaConfig& b) {
  return a.rope_theta == b.rope_theta && SameRope(a.rope, b.rope);
}

double YarnDefaultAttentionFactor(double factor) { return YarnMscale(factor, 1.0); }

}  // namespace ithaca
