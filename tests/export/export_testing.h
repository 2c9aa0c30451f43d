// For the export tests: a short training run of the tiny preset that leaves a checkpoint (and,
// through checkpoint.export, the trainer's own export) behind.
#pragma once

#include <string>

#include "engine/core/status.h"
#include "engine/model/config.h"

namespace ithaca {

struct TinyJob {
  std::string model_dir;       // config.json (the tiny preset) + tokenizer and generation files
  std::string checkpoint_dir;  // the job's checkpoint.dir
  std::string tokens;          // the byte-level token file it trained on
};

// Under `dir`: writes the model directory, tokenizes `corpus` (plain text) and trains `steps`
// steps on the CPU backend with checkpoint.export = `export_dtype` ("" for none). The model
// directory's tokenizer.json and tokenizer_config.json are `tokenizer_dir`'s (a real tokenizer
// transformers loads), or small stand-ins when it is empty. `steps_per_run` > 0 calls
// Trainer::Run for that many steps at a time, as the daemon's worker does (one step a call).
absl::StatusOr<TinyJob> TrainTinyJob(const std::string& dir, const std::string& corpus,
                                     int64_t steps, const std::string& export_dtype,
                                     const std::string& tokenizer_dir = "",
                                     int64_t steps_per_run = 0);
// The same with another model than the tiny preset (another family, say).
absl::StatusOr<TinyJob> TrainTinyJob(const std::string& dir, const std::string& corpus,
                                     int64_t steps, const std::string& export_dtype,
                                     const LlamaConfig& model);

}  // namespace ithaca
