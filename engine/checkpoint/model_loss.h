// The loss of a Hugging Face model directory on given token ids, computed by Ithaca's own model
// (LlamaModel on the CPU backend, f32), for comparing an export with what transformers computes
// on it (tests/golden/verify_export.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

struct ModelLoss {
  double loss = 0;     // mean next-token cross-entropy
  int64_t tokens = 0;  // labelled positions: ids.size() - 1
};

// Reads `dir`/config.json and its safetensors (one file or shards; bf16 tensors are widened to
// f32) and scores `ids` the way transformers does with labels = input_ids: ids[i+1] is the label
// of position i.
// With `lora_dir`, a PEFT adapter directory (adapter_config.json, adapter_model.safetensors) on
// top: the loss of the adapted model, as peft.PeftModel.from_pretrained(base, lora_dir) computes.
absl::StatusOr<ModelLoss> ComputeModelLoss(const std::string& dir, const std::vector<int32_t>& ids,
                                           const std::string& lora_dir = "");

// {"input_ids": [...]} (or a bare JSON array of ints): at least two ids, each >= 0.
absl::StatusOr<std::vector<int32_t>> ReadTokenIdsJson(const std::string& path);

}  // namespace ithaca
