#include "engine/model/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "engine/core/file_util.h"

namespace ithaca {
namespace {

uint64_t Mix(uint64_t x) {  // SplitMix64's finalizer, as weights.cc draws
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::string PeftKey(const std::string& hf_name) { return "base_model.model." + hf_name; }

void LoraInitUnitInto(const ParamLayout& layout, int unit, uint64_t seed, float* out) {
  const ParamUnit& u = layout.units()[unit];
  const uint64_t key = Mix(Mix(seed ^ 0x4c6f5241ull) ^ static_cast<uint64_t>(unit));
  for (size_t i = 0; i < u.entries.size(); ++i) {
    const ParamEntry& e = u.entries[i];
    float* at = out + e.offset;
    const int64_t n = NumElements(e.shape);
    if (i % 2 == 1) {  // lora_B
      std::fill(at, at + n, 0.f);
      continue;
    }
    // kaiming_uniform_(a=√5): gain √(2 / (1 + 5)), bound gain·√(3 / fan_in) = 1/√fan_in.
    const float bound = 1.f / std::sqrt(static_cast<float>(e.shape[1]));
    for (int64_t j = 0; j < n; ++j) {
      const uint64_t h = Mix(key + static_cast<uint64_t>(e.offset + j));
      const float u01 = static_cast<float>(h >> 40) * (1.f / 16777216.f);  // [0, 1)
      at[j] = (2.f * u01 - 1.f) * bound;
    }
  }
}

absl::StatusOr<LoraConfig> ReadPeftConfig(const std::string& dir) {
  const std::string path = dir + "/adapter_config.json";
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (!j.is_object()) return bad("not a JSON object");
  if (j.value("peft_type", std::string()) != "LORA") return bad("peft_type: not \"LORA\"");
  LoraConfig lora;
  const auto r = j.find("r");
  if (r == j.end() || !r->is_number_integer() || r->get<int64_t>() < 1 ||
      r->get<int64_t>() > 65536) {
    return bad("r: must be an integer in [1, 65536]");
  }
  lora.rank = r->get<int64_t>();
  const auto alpha = j.find("lora_alpha");
  if (alpha == j.end() || !alpha->is_number() || !(alpha->get<double>() > 0)) {
    return bad("lora_alpha: must be a number > 0");
  }
  lora.alpha = alpha->get<double>();
  const auto dropout = j.find("lora_dropout");
  if (dropout != j.end() && !dropout->is_null() &&
      (!dropout->is_number() || dropout->get<double>() != 0)) {
    return bad("lora_dropout: only 0 is implemented");
  }
  for (const char* unsupported : {"use_dora", "use_rslora"}) {
    const auto it = j.find(unsupported);
    if (it != j.end() && it->is_boolean() && it->get<bool>()) {
      return bad(absl::StrCat(unsupported, ": not implemented"));
    }
  }
  for (const char* unsupported : {"rank_pattern", "alpha_pattern"}) {
    const auto it = j.find(unsupported);
    if (it != j.end() && it->is_object() && !it->empty()) {
      return bad(absl::StrCat(unsupported, ": per-module ranks are not implemented"));
    }
  }
  const auto tm = j.find("target_modules");
  if (tm == j.end() || !tm->is_array() || tm->empty()) {
    return bad("target_modules: must be a list of module names (q_proj, ..., down_proj)");
  }
  for (const auto& t : *tm) {
    const int target = t.is_string() ? LoraTargetOf(t.get<std::string>()) : -1;
    if (target < 0)
      return bad(absl::StrCat("target_modules: ", t.dump(), " is not one of the seven"));
    lora.targets[target] = true;
  }
  return lora;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenPeftAdapter(const std::string& dir,
                                                                   const LoraConfig& lora) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.init: ", dir, "/adapter_config.json: ", what));
  };
  absl::StatusOr<LoraConfig> got = ReadPeftConfig(dir);
  if (!got.ok())
    return absl::InvalidArgumentError(absl::StrCat("lora.init: ", got.status().message()));
  if (got->rank != lora.rank) return bad(absl::StrCat("r must be lora.rank (", lora.rank, ")"));
  if (got->alpha != lora.alpha) {
    return bad(absl::StrCat("lora_alpha must be lora.alpha (", lora.alpha, ")"));
  }
  if (!std::equal(std::begin(got->targets), std::end(got->targets), std::begin(lora.targets))) {
    return bad("target_modules must be lora.targets");
  }
  return SafetensorsReader::Open(dir + "/adapter_model.safetensors");
}

absl::Status ReadPeftUnitInto(const ParamLayout& layout, const SafetensorsReader& reader, int unit,
                              float* out) {
  for (const ParamEntry& e : layout.units()[unit].entries) {
    RETURN_IF_ERROR(reader.Read(PeftKey(e.hf_name), e.shape, DType::kF32, out + e.offset));
  }
  return absl::OkStatus();
}

absl::Status WritePeftAdapter(const std::string& dir, const LlamaConfig& cfg,
                              const ParamLayout& layout, const std::vector<const float*>& units,
                              const std::string& base_model) {
  RETURN_IF_ERROR(MakeDirs(dir));
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const int u = layout.lora_unit(l);
    for (const ParamEntry& e : layout.units()[u].entries) {
      writer.Add(PeftKey(e.hf_name), DType::kF32, e.shape, units[u] + e.offset, DType::kF32);
    }
  }
  RETURN_IF_ERROR(writer.WriteFile(dir + "/adapter_model.safetensors"));
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", cfg.lora.rank},
                      {"lora_alpha", cfg.lora.alpha},
                      {"lora_dropout", 0.0},
                      {"target_modules", LoraTargetNames(cfg.lora)},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"init_lora_weights", true},
                      {"inference_mode", true},
                      {"base_model_name_or_path", base_model}};
  return WriteFileAtomic(dir + "/adapter_config.json", j.dump(2) + "\n");
}

}  // namespace ithaca
