#include "tests/export/export_testing.h"

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/core/file_util.h"
#include "engine/memory/allocator.h"
#include "engine/model/config.h"
#include "engine/plan/resolve.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "engine/train/trainer.h"

namespace ithaca {

namespace {

absl::StatusOr<TinyJob> Train(const std::string& dir, const std::string& corpus, int64_t steps,
                              const std::string& export_dtype, const std::string& tokenizer_dir,
                              int64_t steps_per_run, const LlamaConfig& cfg) {
  TinyJob job;
  job.model_dir = dir + "/source_model";
  job.checkpoint_dir = dir + "/checkpoints";
  job.tokens = dir + "/corpus.tok";
  RETURN_IF_ERROR(MakeDirs(job.model_dir));
  RETURN_IF_ERROR(WriteFileAtomic(job.model_dir + "/config.json", ConfigToJson(cfg)));
  // Stand-ins with recognizable contents: the export must copy them byte for byte.
  RETURN_IF_ERROR(
      WriteFileAtomic(job.model_dir + "/special_tokens_map.json", "{\"bos_token\": \"<s>\"}\n"));
  RETURN_IF_ERROR(WriteFileAtomic(job.model_dir + "/generation_config.json",
                                  "{\"bos_token_id\": 256, \"do_sample\": true}\n"));
  if (tokenizer_dir.empty()) {
    RETURN_IF_ERROR(
        WriteFileAtomic(job.model_dir + "/tokenizer_config.json",
                        "{\"model_max_length\": 131072, \"tokenizer_class\": \"X\"}\n"));
    RETURN_IF_ERROR(WriteFileAtomic(job.model_dir + "/tokenizer.json",
                                    "{\"version\": \"1.0\", \"model\": {}}\n"));
  } else {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      ASSIGN_OR_RETURN(std::string text, ReadFileToString(tokenizer_dir + "/" + f));
      RETURN_IF_ERROR(WriteFileAtomic(job.model_dir + "/" + f, text));
    }
  }

  ASSIGN_OR_RETURN(std::string text, ReadFileToString(corpus));
  RETURN_IF_ERROR(WriteTokenFile(job.tokens, ByteTokenize(text), kByteVocab));

  JobSpec spec;
  spec.model.config = job.model_dir + "/config.json";
  spec.data.path = job.tokens;
  spec.data.seq_len = 64;
  // Byte-level data for a model with its own tokenizer.json: on purpose (the export is tested).
  spec.data.byte_tokens = true;
  spec.training.steps = steps;
  spec.training.lr = 3e-3;
  spec.training.warmup_steps = 1;
  spec.memory.tile_tokens = 16;
  spec.checkpoint.dir = job.checkpoint_dir;
  spec.checkpoint.export_dtype = export_dtype;
  NodeResources node;
  node.host_memory_bytes = int64_t{64} << 30;
  node.ranks_on_host = 1;
  ASSIGN_OR_RETURN(ResolvedJob resolved, ResolveJob(spec, node));
  CpuOps ops;
  HostAllocator alloc;
  ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(resolved.spec, &ops, &alloc));
  if (steps_per_run <= 0) {
    RETURN_IF_ERROR(trainer->Run());
  } else {
    while (trainer->state().step < steps) {
      RETURN_IF_ERROR(trainer->Run(nullptr, trainer->state().step + steps_per_run));
    }
  }
  return job;
}

}  // namespace

absl::StatusOr<TinyJob> TrainTinyJob(const std::string& dir, const std::string& corpus,
                                     int64_t steps, const std::string& export_dtype,
                                     const std::string& tokenizer_dir, int64_t steps_per_run) {
  ASSIGN_OR_RETURN(LlamaConfig cfg, PresetConfig("tiny"));
  return Train(dir, corpus, steps, export_dtype, tokenizer_dir, steps_per_run, cfg);
}

absl::StatusOr<TinyJob> TrainTinyJob(const std::string& dir, const std::string& corpus,
                                     int64_t steps, const std::string& export_dtype,
                                     const LlamaConfig& model) {
  return Train(dir, corpus, steps, export_dtype, "", 0, model);
}

}  // namespace ithaca
