// Phases (docs/long_context.md): what a resume must find, that it keeps the run's RoPE, and what a
// new phase ([init] from) starts from and writes into.
#include "engine/checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/checkpoint/checkpoint_internal.h"
#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"

namespace ithaca {

using checkpoint_internal::kManifest;

absl::Status CheckResumeHasWork(const std::string& dir, int64_t steps,
                                const std::string& checkpoint, const TrainState& saved,
                                const std::string& run_id) {
  if (steps == 0 || saved.step < steps) return absl::OkStatus();
  if (saved.step == steps && !run_id.empty() && saved.run_id == run_id) return absl::OkStatus();
  const std::string done =
      saved.step == steps ? absl::StrCat("holds a finished run: ", checkpoint, " is at step ",
                                         saved.step, " of training.steps = ", steps)
                          : absl::StrCat("holds a run past this one's end: ", checkpoint,
                                         " is at step ", saved.step, ", training.steps = ", steps);
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint.dir ", dir, " ", done,
      ", so nothing would train. To continue it, raise training.steps above ", saved.step,
      " (the learning-rate schedule continues from where it ended); to start over, use another "
      "checkpoint.dir"));
}

absl::Status CheckResumeRope(const std::string& checkpoint, const LlamaConfig& cfg) {
  RETURN_IF_ERROR(CheckCheckpointStep(checkpoint));
  absl::StatusOr<LlamaConfig> saved = LoadConfigJson(checkpoint + "/model/config.json");
  if (!saved.ok()) return saved.status();
  if (SameModelRope(*saved, cfg)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "model.rope: the job's RoPE (", DescribeModelRope(cfg), ") is not the one ", checkpoint,
      " was trained with (", DescribeModelRope(*saved),
      "); a resume keeps the run's RoPE. To train on with another RoPE, start a new phase: a "
      "checkpoint.dir of its own and [init] from = \"",
      checkpoint.substr(0, checkpoint.rfind('/')), "\" (docs/long_context.md)"));
}

absl::StatusOr<std::string> InitWeightsDir(const std::string& from) {
  struct stat st;
  if (stat(from.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(
        "init.from: ", from,
        ": no such directory (a checkpoint.dir, a step directory or a Hugging Face model "
        "directory)"));
  }
  if (PathExists(from + "/config.json")) return from;  // a Hugging Face model directory
  if (PathExists(from + "/" + kManifest)) return from + "/model";
  if (PathExists(from + "/model") || PathExists(from + "/state.json")) {
    return absl::DataLossError(absl::StrCat("init.from: ", from, "/", kManifest,
                                            ": missing (an incomplete or damaged checkpoint)"));
  }
  absl::StatusOr<std::string> latest = LatestCheckpoint(from);
  if (!latest.ok()) {
    return absl::NotFoundError(absl::StrCat(
        "init.from: ", from,
        ": holds no complete checkpoint and no config.json (neither a checkpoint.dir with a "
        "checkpoint, a step directory nor a Hugging Face model directory)"));
  }
  return *latest + "/model";
}

bool HoldsAdaptersOnly(const SafetensorsReader& weights) {
  bool adapters = false, base = false;
  for (const std::string& name : weights.Names()) {
    (absl::StrContains(name, ".lora_A.") || absl::StrContains(name, ".lora_B.") ? adapters : base) =
        true;
  }
  return adapters && !base;
}

absl::Status CheckNotAdaptersOnly(const SafetensorsReader& weights, const std::string& key,
                                  const std::string& dir) {
  if (!HoldsAdaptersOnly(weights)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      key, ": ", dir,
      " holds a LoRA run's adapters alone (its checkpoints leave out the frozen base); start "
      "from the merged model (ithaca-export with lora.merge_on_export, or the run's export "
      "with it on), or keep [lora] with the base model as model.weights and lora.init = the "
      "run's exported PEFT adapter"));
}

absl::Status CheckInitModel(const std::string& weights, const LlamaConfig& cfg) {
  const std::string path = weights + "/config.json";
  if (!PathExists(path)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const LlamaConfig from, LoadConfigJson(path));
  struct Key {
    const char* name;
    std::string theirs, ours;
  };
  auto b = [](bool v) { return std::string(v ? "true" : "false"); };
  auto n = [](auto v) { return absl::StrCat(v); };
  const Key keys[] = {
      {"model_type", ModelTypeName(from.family), ModelTypeName(cfg.family)},
      {"hidden_size", n(from.hidden_size), n(cfg.hidden_size)},
      {"intermediate_size", n(from.intermediate_size), n(cfg.intermediate_size)},
      {"num_hidden_layers", n(from.num_hidden_layers), n(cfg.num_hidden_layers)},
      {"num_attention_heads", n(from.num_attention_heads), n(cfg.num_attention_heads)},
      {"num_key_value_heads", n(from.num_key_value_heads), n(cfg.num_key_value_heads)},
      {"head_dim", n(from.head_dim), n(cfg.head_dim)},
      {"vocab_size", n(from.vocab_size), n(cfg.vocab_size)},
      {"rms_norm_eps", n(from.rms_norm_eps), n(cfg.rms_norm_eps)},
      {"tie_word_embeddings", b(from.tie_word_embeddings), b(cfg.tie_word_embeddings)},
      {"attention_bias", b(from.qkv_bias), b(cfg.qkv_bias)},
      {"qk_norm", b(from.qk_norm), b(cfg.qk_norm)},
      {"sliding_window", n(from.sliding_window), n(cfg.sliding_window)},
      {"the first windowed layer", n(from.window_first_layer), n(cfg.window_first_layer)},
  };
  for (const Key& k : keys) {
    if (k.theirs != k.ours) {
      return absl::FailedPreconditionError(absl::StrCat(
          "init.from: ", path, " has ", k.name, " ", k.theirs, ", the job's model ", k.ours,
          ": a new phase starts from weights of the job's own model (only [model.rope] and the "
          "context may change); name that model in [model], or start from other weights"));
    }
  }
  return absl::OkStatus();
}

std::string CheckpointStepOfWeights(const std::string& weights) {
  const size_t slash = weights.rfind('/');
  if (slash == std::string::npos || weights.substr(slash + 1) != "model") return "";
  const std::string step = weights.substr(0, slash);
  return PathExists(step + "/" + kManifest) ? step : "";
}

absl::Status CheckInitTarget(const std::string& dir, const std::string& run_id) {
  if (dir.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> latest = LatestCheckpoint(dir);
  if (!latest.ok()) return absl::OkStatus();
  absl::StatusOr<TrainState> saved = ReadCheckpointState(*latest);
  if (saved.ok() && !run_id.empty() && saved->run_id == run_id) return absl::OkStatus();
  std::string run = "a run";
  if (saved.ok()) {
    // ithaca-worker's run id under ithacad is "ithacad SOCKET JOB".
    const std::string& id = saved->run_id;
    const size_t space = id.rfind(' ');
    run = id.empty() ? "a run without an id"
          : absl::StartsWith(id, "ithacad ") && space != std::string::npos
              ? absl::StrCat("the run of job ", id.substr(space + 1), " (run \"", id, "\")")
              : absl::StrCat("run \"", id, "\"");
    absl::StrAppend(&run, ", at step ", saved->step);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "init.from: checkpoint.dir ", dir, " already holds ", run, " (", *latest,
      "); a new phase starts a run of its own: give it an empty checkpoint.dir, or drop [init] "
      "to resume that run"));
}

}  // namespace ithaca
