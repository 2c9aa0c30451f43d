// LoRA adapters on the host: PEFT's initialization, and PEFT adapter directories
// (adapter_config.json + adapter_model.safetensors) in and out, for a layout with LoRA units
// (ParamLayout::lora_unit).
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/model/safetensors.h"

namespace ithaca {

// PEFT's key of an adapter tensor: "base_model.model." + its name in the layout
// ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight").
std::string PeftKey(const std::string& hf_name);

// PEFT's own init of one LoRA unit into `out` (the unit's numel floats): every lora_A
// Kaiming-uniform with a = √5 as torch's nn.Linear (U(−1/√in, 1/√in)), deterministic in `seed`
// and the unit, and every lora_B zero, so the adapted model starts as the base.
void LoraInitUnitInto(const ParamLayout& layout, int unit, uint64_t seed, float* out);

// `dir`/adapter_config.json as a LoraConfig: peft_type LORA, r, lora_alpha, target_modules (a
// list of the seven module names), lora_dropout 0, no DoRA or rsLoRA; errors name the key.
absl::StatusOr<LoraConfig> ReadPeftConfig(const std::string& dir);

// Checks `dir`/adapter_config.json against the job's LoRA (peft_type LORA, r, lora_alpha, the
// same target_modules, lora_dropout 0) and opens its adapter_model.safetensors.
absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenPeftAdapter(const std::string& dir,
                                                                   const LoraConfig& lora);
// One LoRA unit's tensors from a PEFT adapter (by PeftKey), into `out`.
absl::Status ReadPeftUnitInto(const ParamLayout& layout, const SafetensorsReader& reader, int unit,
                              float* out);

// Writes a PEFT adapter directory: adapter_config.json (peft_type LORA, r, lora_alpha,
// target_modules, base_model_name_or_path) and adapter_model.safetensors in f32, from every
// LoRA unit of the layout (`units[u]` the whole unit u, for u a LoRA unit).
absl::Status WritePeftAdapter(const std::string& dir, const LlamaConfig& cfg,
                              const ParamLayout& layout, const std::vector<const float*>& units,
                              const std::string& base_model);

}  // namespace ithaca
