// Loading a checkpoint: its state.json, and its tensors as whole units (one process) or as the
// slices of each unit a rank holds, read straight from their byte ranges.
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
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace ithaca {

using checkpoint_internal::SecondsSince;

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path,
                                                const ParamLayout& layout) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(path));
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    RETURN_IF_ERROR(VerifyCheckpointFile(path, manifest, i));
  }
  std::vector<UnitSlice> whole;
  for (const ParamUnit& unit : layout.units()) whole.push_back({0, unit.numel});
  ASSIGN_OR_RETURN(LoadedCheckpoint out, LoadCheckpointSlices(path, layout, whole));
  out.verified_bytes = manifest.total_bytes;
  out.seconds = SecondsSince(start);
  return out;
}

absl::StatusOr<TrainState> ReadCheckpointState(const std::string& path) {
  RETURN_IF_ERROR(CheckCheckpointStep(path));
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path + "/state.json", kMaxJsonConfigBytes));
  nlohmann::json js = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TrainState state;
  if (js.is_discarded() || !js.is_object() || !js.contains("step") ||
      !js["step"].is_number_integer() || !js.contains("data_position") ||
      !js["data_position"].is_number_integer()) {
    return absl::DataLossError(path + "/state.json: corrupt (needs integer step, data_position)");
  }
  state.step = js["step"].get<int64_t>();
  state.data_position = js["data_position"].get<int64_t>();
  if (js.contains("tokens") && js["tokens"].is_number_integer()) {
    state.tokens = js["tokens"].get<int64_t>();
  }
  if (js.contains("schedule_steps") && js["schedule_steps"].is_number_integer()) {
    state.schedule_steps = js["schedule_steps"].get<int64_t>();
  }
  if (js.contains("lr") && js["lr"].is_number()) state.lr = js["lr"].get<double>();
  // A damaged (or forged) state must not reach the trainer: negative counts abort it. Refused
  // here as data loss, which is not retried (the same file fails the same way every time).
  for (auto [name, v] : {std::pair<const char*, int64_t>{"step", state.step},
                         {"data_position", state.data_position},
                         {"tokens", state.tokens},
                         {"schedule_steps", state.schedule_steps}}) {
    if (v < 0) {
      return absl::DataLossError(
          absl::StrCat(path, "/state.json: corrupt: ", name, " is ", v, ", expected >= 0"));
    }
  }
  if (!std::isfinite(state.lr) || state.lr < 0) {
    return absl::DataLossError(absl::StrCat(path, "/state.json: corrupt: lr is ", state.lr));
  }
  if (js.contains("run_id") && js["run_id"].is_string()) {
    state.run_id = js["run_id"].get<std::string>();
  }
  if (js.contains("source_model") && js["source_model"].is_string()) {
    state.source_model = js["source_model"].get<std::string>();
  }
  if (js.contains("lora")) {
    const nlohmann::json& l = js["lora"];
    auto corrupt = [&](const std::string& what) {
      return absl::DataLossError(absl::StrCat(path, "/state.json: corrupt: lora: ", what));
    };
    if (!l.is_object() || !l.contains("r") || !l["r"].is_number_integer() ||
        l["r"].get<int64_t>() <= 0) {
      return corrupt("needs an integer r > 0");
    }
    if (!l.contains("lora_alpha") || !l["lora_alpha"].is_number() ||
        !std::isfinite(l["lora_alpha"].get<double>()) || l["lora_alpha"].get<double>() <= 0) {
      return corrupt("needs a number lora_alpha > 0");
    }
    if (!l.contains("target_modules") || !l["target_modules"].is_array() ||
        l["target_modules"].empty()) {
      return corrupt("needs a list target_modules");
    }
    state.lora.rank = l["r"].get<int64_t>();
    state.lora.alpha = l["lora_alpha"].get<double>();
    for (const nlohmann::json& name : l["target_modules"]) {
      const int t = name.is_string() ? LoraTargetOf(name.get<std::string>()) : -1;
      if (t < 0) return corrupt(absl::StrCat("target_modules: ", name.dump(), " is no target"));
      state.lora.targets[t] = true;
    }
  }
  return state;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointSlices(const std::string& path,
                                                      const ParamLayout& layout,
                                                      const std::vector<UnitSlice>& slices,
                                                      const OptimizerUnitSink& sink) {
  const auto start = std::chrono::steady_clock::now();
  if (slices.size() != layout.units().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LoadCheckpointSlices: ", slices.size(), " slices for ", layout.units().size(), " units"));
  }
  LoadedCheckpoint out;
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(path));
  out.bytes = manifest.total_bytes;
  ASSIGN_OR_RETURN(out.state, ReadCheckpointState(path));
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path + "/state.json", kMaxJsonConfigBytes));
  nlohmann::json js = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  out.saved_world =
      js.contains("world") && js["world"].is_number_integer() ? js["world"].get<int>() : 1;
  if (out.saved_world < 1) {
    return absl::DataLossError(
        absl::StrCat(path, "/state.json: corrupt: world is ", out.saved_world, ", expected >= 1"));
  }

  // Opening maps the files and parses their headers only; the reads below touch just the bytes
  // of this rank's slices.
  ASSIGN_OR_RETURN(auto weights, SafetensorsReader::Open(path + "/model"));
  // One file, or the sharded layout of a checkpoint saved by several ranks.
  const std::string one_file = path + "/optimizer.safetensors";
  ASSIGN_OR_RETURN(auto moments,
                   SafetensorsReader::Open(PathExists(one_file) ? one_file : path + "/optimizer"));
  // Verifying checks only what the manifest lists: what is read must be among it.
  RETURN_IF_ERROR(CheckManifestListsFiles(path, manifest, *weights));
  RETURN_IF_ERROR(CheckManifestListsFiles(path, manifest, *moments));
  struct Kind {
    const SafetensorsReader* reader;
    std::string prefix;
    HostWeights* out;
  };
  const Kind kinds[] = {{weights.get(), "", &out.optimizer.master},
                        {moments.get(), "m.", &out.optimizer.m},
                        {moments.get(), "v.", &out.optimizer.v}};
  // Every tensor's name, shape and dtype first, whatever the slices: a mismatch is the same
  // error on every rank.
  for (const Kind& k : kinds) {
    for (const ParamUnit& unit : layout.units()) {
      if (!unit.trainable) continue;  // a frozen base (LoRA) is not in a checkpoint
      for (const ParamEntry& e : unit.entries) {
        ASSIGN_OR_RETURN(TensorInfo info, k.reader->Info(k.prefix + e.hf_name));
        if (info.shape != e.shape || info.dtype != DType::kF32) {
          return absl::DataLossError(
              absl::StrCat(path, ": tensor '", k.prefix, e.hf_name, "' is ", DTypeName(info.dtype),
                           " ", ShapeString(info.shape), ", expected f32 ", ShapeString(e.shape)));
        }
      }
    }
  }
  for (size_t u = 0; u < layout.units().size(); ++u) {
    if (!layout.units()[u].trainable) {  // nothing saved: empty, and no call of the sink
      if (!sink) {
        for (int k = 0; k < 3; ++k) kinds[k].out->emplace_back();
      }
      continue;
    }
    const UnitSlice& slice = slices[u];
    const int64_t end = slice.begin + slice.numel;
    std::vector<float> parts[3];
    for (int k = 0; k < 3; ++k) {
      parts[k].assign(slice.numel, 0.f);  // zeros past the unit's end
      for (const ParamEntry& e : layout.units()[u].entries) {
        const int64_t lo = std::max(slice.begin, e.offset);
        const int64_t hi = std::min(end, e.offset + NumElements(e.shape));
        if (lo >= hi) continue;
        RETURN_IF_ERROR(kinds[k].reader->ReadRange(kinds[k].prefix + e.hf_name, e.shape,
                                                   lo - e.offset, hi - lo, DType::kF32,
                                                   parts[k].data() + (lo - slice.begin)));
        out.read_bytes += (hi - lo) * 4;
      }
    }
    if (sink) {
      out.host_bytes = std::max(out.host_bytes, 3 * 4 * slice.numel);
      RETURN_IF_ERROR(
          sink(static_cast<int>(u), std::move(parts[0]), std::move(parts[1]), std::move(parts[2])));
    } else {
      out.host_bytes += 3 * 4 * slice.numel;
      for (int k = 0; k < 3; ++k) kinds[k].out->push_back(std::move(parts[k]));
    }
  }
  out.seconds = SecondsSince(start);
  return out;
}

}  // namespace ithaca
