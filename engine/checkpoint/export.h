// Inference-ready export of a training checkpoint: the f32 master weights of one step as a
// Hugging Face model directory that transformers loads as it is (config.json in the hub dialect
// with torch_dtype, safetensors in bf16 or f32, sharded behind model.safetensors.index.json
// above the shard size, and the source model's tokenizer files and generation_config.json).
//
// The directory appears whole or not at all: everything is written under a hidden temporary
// name next to the output and renamed into place at the end; on any error the temporary is
// removed and the output is left as it was.
#pragma once

#include <string>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/model/config.h"

namespace ithaca {

// What transformers' save_pretrained uses ("5GB", decimal).
inline constexpr int64_t kExportShardBytes = 5'000'000'000;

struct ExportOptions {
  DType dtype = DType::kBF16;                   // of the exported tensors: kBF16 or kF32
  int64_t max_shard_bytes = kExportShardBytes;  // one file up to this size, shards above it
  // The model directory the job started from; its tokenizer and generation files (kCopiedFiles)
  // are copied when present. Empty: none are copied.
  std::string source_model_dir;
  // Replace an existing `out` (the trainer's own export directory). Otherwise `out` must not
  // exist or be an empty directory.
  bool replace = false;
  // The length the model was trained at (the trainer's data.seq_len): config.json's
  // max_position_embeddings is raised to it when below. 0: as the checkpoint says.
  int64_t trained_seq_len = 0;
  // A LoRA checkpoint (its model/ holds the adapters alone). `lora` is the run's [lora]; rank 0
  // here: ExportCheckpoint takes it from the checkpoint's state.json. Without `lora_base` the
  // export is the PEFT adapter directory (adapter_config.json, adapter_model.safetensors in f32,
  // whatever `dtype`; base_model_name_or_path `peft_base_model`, by default the model directory
  // the run started from). With it, the merged model: every weight from `lora_base` (a
  // safetensors file, index or directory), each targeted linear's + lora.scale() · B · A.
  LoraConfig lora;
  std::string lora_base;
  std::string peft_base_model;
};

// Copied from ExportOptions::source_model_dir when present there.
inline constexpr const char* kCopiedFiles[] = {
    "tokenizer.json",  "tokenizer_config.json",  "special_tokens_map.json",
    "tokenizer.model", "generation_config.json",
};

// "bf16" -> kBF16, "f32" -> kF32; anything else INVALID_ARGUMENT naming it.
absl::StatusOr<DType> ParseExportDType(const std::string& name);

// `path` is one step directory (it has a manifest.json) or a job's checkpoint.dir (its newest
// complete step). NOT_FOUND naming the path when it holds neither.
absl::StatusOr<std::string> FindCheckpoint(const std::string& path);

// Verifies the checkpoint against its manifest, then writes its model to `out` (a LoRA run's: its
// adapter or the merged model, ExportOptions::lora). Without options.source_model_dir, the model
// directory the run started from (its state.json records it) gives the tokenizer and generation
// config of a model export, when that directory still exists.
absl::Status ExportCheckpoint(const std::string& checkpoint, const std::string& out,
                              const ExportOptions& options);

}  // namespace ithaca
