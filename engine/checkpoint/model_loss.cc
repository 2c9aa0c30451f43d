#include "engine/checkpoint/model_loss.h"

#include <nlohmann/json.hpp>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/memory/allocator.h"
#include "engine/model/config.h"
#include "engine/model/safetensors.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"

namespace ithaca {

absl::StatusOr<ModelLoss> ComputeModelLoss(const std::string& dir, const std::vector<int32_t>& ids,
                                           const std::string& lora_dir) {
  if (ids.size() < 2) return absl::InvalidArgumentError("need at least two token ids");
  ASSIGN_OR_RETURN(LlamaConfig cfg, LoadConfigJson(dir));
  for (int32_t id : ids) {
    if (id < 0 || id >= cfg.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside the vocabulary of ",
                                                     dir, "/config.json (", cfg.vocab_size, ")"));
    }
  }
  ASSIGN_OR_RETURN(auto reader, SafetensorsReader::Open(dir));
  std::unique_ptr<SafetensorsReader> adapter;
  if (!lora_dir.empty()) {
    ASSIGN_OR_RETURN(cfg.lora, ReadPeftConfig(lora_dir));
    ASSIGN_OR_RETURN(adapter, OpenPeftAdapter(lora_dir, cfg.lora));
  }
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(auto model, LlamaModel::Create(cfg, &ops, &alloc, LlamaModel::Options()));
  for (int u = 0; u < model->layout().num_units(); ++u) {
    std::vector<float> w(model->layout().units()[u].numel);
    if (adapter && model->layout().units()[u].trainable) {
      RETURN_IF_ERROR(ReadPeftUnitInto(model->layout(), *adapter, u, w.data()));
    } else {
      RETURN_IF_ERROR(ReadUnitWeightsInto(model->layout(), *reader, u, w.data()));
    }
    ops.Upload(w.data(), DType::kF32, model->params().working_shard(u));
  }
  std::vector<int32_t> labels(ids.begin() + 1, ids.end());
  labels.push_back(-1);  // the last position has no next token
  ASSIGN_OR_RETURN(LossSum sum, model->ForwardBackward(ids.data(), labels.data(),
                                                       static_cast<int64_t>(ids.size()), 1.f));
  if (sum.tokens == 0) return absl::InternalError("no labelled tokens");
  return ModelLoss{sum.loss_sum / static_cast<double>(sum.tokens), sum.tokens};
}

absl::StatusOr<std::vector<int32_t>> ReadTokenIdsJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("input_ids")) j = j["input_ids"];
  if (!j.is_array() || j.size() < 2) {
    return absl::InvalidArgumentError(
        path + ": expected {\"input_ids\": [...]} or a JSON array of at least two token ids");
  }
  std::vector<int32_t> ids;
  for (const nlohmann::json& v : j) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(path + ": bad token id " + v.dump());
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace ithaca
