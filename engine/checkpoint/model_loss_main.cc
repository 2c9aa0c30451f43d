// ithaca-model-loss MODEL_DIR IDS_JSON: Ithaca's loss (LlamaModel on the CPU backend, f32) of a
// Hugging Face model directory on the token ids in IDS_JSON ({"input_ids": [...]}), printed as
// JSON. tests/golden/verify_export.py prints transformers' loss for the same inputs. With
// --lora DIR, the model with that PEFT adapter on top (tests/lora/peft_roundtrip.py).
#include <cstdio>
#include <string>

#include "engine/checkpoint/model_loss.h"

int main(int argc, char** argv) {
  const bool lora = argc == 5 && std::string(argv[3]) == "--lora";
  if (argc != 3 && !lora) {
    std::fprintf(stderr, "usage: ithaca-model-loss MODEL_DIR IDS_JSON [--lora PEFT_ADAPTER_DIR]\n");
    return 2;
  }
  absl::StatusOr<std::vector<int32_t>> ids = ithaca::ReadTokenIdsJson(argv[2]);
  if (!ids.ok()) {
    std::fprintf(stderr, "ithaca-model-loss: %s\n", std::string(ids.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<ithaca::ModelLoss> loss =
      ithaca::ComputeModelLoss(argv[1], *ids, lora ? argv[4] : "");
  if (!loss.ok()) {
    std::fprintf(stderr, "ithaca-model-loss: %s\n", std::string(loss.status().message()).c_str());
    return 1;
  }
  std::printf("{\"loss\": %.9f, \"tokens\": %lld}\n", loss->loss,
              static_cast<long long>(loss->tokens));
  return 0;
}
