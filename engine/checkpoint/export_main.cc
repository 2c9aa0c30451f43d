// ithaca-export: a training checkpoint as an inference-ready Hugging Face model directory, e.g.
//   ithaca-export runs/job/checkpoints --out runs/job/model --dtype bf16
//       --source-model /models/Llama-3.2-1B
// A LoRA run's checkpoint (the adapters alone) is exported as its PEFT adapter directory, or with
// --merge-base the base model it trained on as the merged model.
// CHECKPOINT_DIR is a job's checkpoint.dir (its newest step) or one step-N directory. The
// output is written under a temporary name and renamed at the end: it appears whole or not at
// all. See engine/checkpoint/export.h. Flags are spelled with dashes
// (engine/core/flag_spelling.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/core/flag_spelling.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/export.h"

ABSL_FLAG(std::string, out, "", "directory to create (must not exist, or be empty)");
ABSL_FLAG(std::string, dtype, "bf16", "dtype of the exported tensors: bf16 or f32");
ABSL_FLAG(std::string, source_model, "",
          "the model directory the job started from: its tokenizer files and "
          "generation_config.json are copied (default: the one the checkpoint records)");
ABSL_FLAG(std::string, merge_base, "",
          "a LoRA run's checkpoint: the base model it trained on (a model directory or "
          "safetensors file); the export is the merged model instead of the PEFT adapter");
ABSL_FLAG(std::string, peft_base_model, "",
          "a LoRA run's PEFT adapter: its base_model_name_or_path (default: the model directory "
          "the run started from)");
ABSL_FLAG(int64_t, max_shard_bytes, ithaca::kExportShardBytes,
          "largest safetensors file; larger models are sharded behind "
          "model.safetensors.index.json (default 5 GB, as transformers)");

namespace ithaca {
namespace {

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "ithaca-export: %s\n", std::string(st.message()).c_str());
  return 1;
}

int Run(const std::string& checkpoint_arg) {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "ithaca-export: --out is required\n%s\n",
                 absl::ProgramUsageMessage().data());
    return 2;
  }
  absl::StatusOr<DType> dtype = ParseExportDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    std::fprintf(stderr, "ithaca-export: --dtype %s: must be bf16 or f32\n",
                 absl::GetFlag(FLAGS_dtype).c_str());
    return 2;
  }
  absl::StatusOr<std::string> checkpoint = FindCheckpoint(checkpoint_arg);
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  ExportOptions options;
  options.dtype = *dtype;
  options.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
  options.source_model_dir = absl::GetFlag(FLAGS_source_model);
  options.lora_base = absl::GetFlag(FLAGS_merge_base);
  options.peft_base_model = absl::GetFlag(FLAGS_peft_base_model);
  absl::Status st = ExportCheckpoint(*checkpoint, out, options);
  if (!st.ok()) return Fail(st);
  const absl::StatusOr<TrainState> state = ReadCheckpointState(*checkpoint);
  if (state.ok() && state->lora.enabled() && options.lora_base.empty()) {
    std::printf("exported the LoRA adapter of %s to %s (PEFT, f32)\n", checkpoint->c_str(),
                out.c_str());
  } else {
    std::printf("exported %s%s to %s (%s)\n", checkpoint->c_str(),
                options.lora_base.empty() ? "" : (" merged into " + options.lora_base).c_str(),
                out.c_str(), absl::GetFlag(FLAGS_dtype).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace ithaca

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A training checkpoint as a Hugging Face model directory.\n"
      "Usage: ithaca-export CHECKPOINT_DIR --out DIR [--dtype bf16|f32] [--source-model DIR]\n"
      "       [--max-shard-bytes N] [--merge-base BASE] [--peft-base-model NAME]");
  if (ithaca::AsksForHelp(argc, argv)) {
    std::printf("%s\n\n%s", absl::ProgramUsageMessage().data(),
                ithaca::DashedFlagHelp("export_main").c_str());
    return 0;
  }
  ithaca::FlagSpelling flags = ithaca::NormalizeFlags("ithaca-export", argc, argv);
  std::vector<char*> args = flags.argv();
  std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (rest.size() != 2) {
    std::fprintf(stderr, "ithaca-export: expected one CHECKPOINT_DIR argument, got %zu\n%s\n",
                 rest.size() - 1, absl::ProgramUsageMessage().data());
    return 2;
  }
  return ithaca::Run(rest[1]);
}
