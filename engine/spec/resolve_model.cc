// The spec's model: its config.json or preset, with [model.rope] over its rotary embedding.
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/spec/job_spec.h"
#include "engine/spec/job_spec_internal.h"

namespace ithaca {

using spec_internal::FormatDouble;

absl::StatusOr<LlamaConfig> ResolveModelConfig(const JobSpec& spec) {
  LlamaConfig cfg;
  if (!spec.model.config.empty()) {
    ASSIGN_OR_RETURN(cfg, LoadConfigJson(spec.model.config));
  } else {
    ASSIGN_OR_RETURN(cfg, PresetConfig(spec.model.preset));
  }
  RETURN_IF_ERROR(ApplyRopeOverride(spec.model.rope, &cfg));
  if (spec.lora.enabled()) {
    cfg.lora.rank = spec.lora.rank;
    cfg.lora.alpha = spec.lora.alpha;
    for (const std::string& t : spec.lora.targets) {
      const int target = LoraTargetOf(t);
      if (target < 0) return absl::InvalidArgumentError(absl::StrCat("lora.targets: \"", t, "\""));
      cfg.lora.targets[target] = true;
    }
  }
  return cfg;
}

absl::Status ApplyRopeOverride(const JobSpec::Model::Rope& o, LlamaConfig* cfg) {
  if (o.theta != 0) {
    if (!(o.theta > 0) || !std::isfinite(o.theta)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.rope.theta: must be > 0, got ", FormatDouble(o.theta)));
    }
    cfg->rope_theta = o.theta;
  }
  if (!o.scaling.empty()) {
    RopeConfig r;
    r.head_dim = cfg->rope.head_dim;
    // The context the model was trained at before this scaling: its own scaling's original
    // context when it has one, else its max_position_embeddings.
    const bool had_original =
        cfg->rope.type == RopeType::kLlama3 || cfg->rope.type == RopeType::kYarn;
    r.original_max_position = o.original_max_position_embeddings > 0
                                  ? o.original_max_position_embeddings
                              : had_original ? cfg->rope.original_max_position
                                             : cfg->max_position_embeddings;
    auto need_factor = [&]() -> absl::Status {
      if (!(o.factor > 0) || !std::isfinite(o.factor)) {
        return absl::InvalidArgumentError(
            absl::StrCat("model.rope.factor: required (> 0) with "
                         "scaling \"",
                         o.scaling, "\""));
      }
      r.factor = o.factor;
      return absl::OkStatus();
    };
    if (o.scaling == "none") {
      r.type = RopeType::kDefault;
    } else if (o.scaling == "linear") {
      r.type = RopeType::kLinear;
      RETURN_IF_ERROR(need_factor());
    } else if (o.scaling == "llama3") {
      r.type = RopeType::kLlama3;
      RETURN_IF_ERROR(need_factor());
      r.low_freq_factor = o.low_freq_factor != 0 ? o.low_freq_factor : 1.0;
      r.high_freq_factor = o.high_freq_factor != 0 ? o.high_freq_factor : 4.0;
      if (!(r.high_freq_factor > r.low_freq_factor)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.rope.high_freq_factor: must exceed low_freq_factor (",
            FormatDouble(r.low_freq_factor), "), got ", FormatDouble(r.high_freq_factor)));
      }
    } else if (o.scaling == "yarn") {
      r.type = RopeType::kYarn;
      RETURN_IF_ERROR(need_factor());
      r.beta_fast = o.beta_fast != 0 ? o.beta_fast : 32.0;
      r.beta_slow = o.beta_slow != 0 ? o.beta_slow : 1.0;
      r.attention_factor =
          o.attention_factor != 0 ? o.attention_factor : YarnDefaultAttentionFactor(o.factor);
      r.truncate = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.rope.scaling: must be \"none\", \"linear\", \"llama3\" or \"yarn\", got \"",
          o.scaling.substr(0, 64), "\""));
    }
    cfg->rope = r;
  }
  cfg->rope.theta = cfg->rope_theta;
  return absl::OkStatus();
}

}  // namespace ithaca
