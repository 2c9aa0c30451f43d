#include "engine/train/checkpoint.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/core/file_util.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace ithaca {
namespace {

constexpr char kPrefix[] = "step-";

std::string StepDirName(int64_t step) { return absl::StrFormat("%s%08d", kPrefix, step); }

// Completed checkpoints (step-NNNNNNNN with a state.json), oldest first.
std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind(kPrefix, 0) == 0 && n.find('.') == std::string::npos &&
        PathExists(dir + "/" + n + "/state.json")) {
      names.push_back(n);
    }
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

absl::Status RemoveTree(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n == "." || n == "..") continue;
      RETURN_IF_ERROR(RemoveTree(path + "/" + n));
    }
    closedir(d);
    if (rmdir(path.c_str()) != 0) return absl::InternalError("cannot remove " + path);
    return absl::OkStatus();
  }
  if (std::remove(path.c_str()) != 0) return absl::InternalError("cannot remove " + path);
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir, const LlamaConfig& cfg,
                            const ParamLayout& layout, const Optimizer::State& opt,
                            const TrainState& state, int64_t keep) {
  RETURN_IF_ERROR(MakeDirs(dir));
  const std::string final_path = dir + "/" + StepDirName(state.step);
  const std::string tmp = absl::StrCat(dir, "/.", StepDirName(state.step), ".tmp.", getpid());
  if (PathExists(tmp)) RETURN_IF_ERROR(RemoveTree(tmp));
  auto fail = [&](absl::Status st) {
    RemoveTree(tmp).IgnoreError();
    return st;
  };
  std::vector<const float*> master;
  for (const auto& u : opt.master) master.push_back(u.data());
  absl::Status st =
      WriteHfCheckpoint(tmp + "/model", cfg, layout, master, DType::kF32, int64_t{4} << 30);
  if (!st.ok()) return fail(st);

  SafetensorsWriter moments;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    for (const ParamEntry& e : layout.units()[u].entries) {
      moments.Add("m." + e.hf_name, DType::kF32, e.shape, opt.m[u].data() + e.offset, DType::kF32);
      moments.Add("v." + e.hf_name, DType::kF32, e.shape, opt.v[u].data() + e.offset, DType::kF32);
    }
  }
  st = moments.WriteFile(tmp + "/optimizer.safetensors");
  if (!st.ok()) return fail(st);
  nlohmann::json js = {{"step", state.step},
                       {"data_position", state.data_position},
                       {"tokens", state.tokens},
                       {"format", "ithaca-checkpoint-v1"}};
  st = WriteFileAtomic(tmp + "/state.json", js.dump(2) + "\n");
  if (!st.ok()) return fail(st);
  if (PathExists(final_path)) RETURN_IF_ERROR(RemoveTree(final_path));
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return fail(absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", final_path)));
  }
  std::vector<std::string> all = ListCheckpoints(dir);
  for (size_t i = 0; i + keep < all.size(); ++i) RETURN_IF_ERROR(RemoveTree(dir + "/" + all[i]));
  return absl::OkStatus();
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  std::vector<std::string> all = ListCheckpoints(dir);
  if (all.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  return dir + "/" + all.back();
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path,
                                                const ParamLayout& layout) {
  LoadedCheckpoint out;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path + "/state.json"));
  nlohmann::json js = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (js.is_discarded() || !js.is_object() || !js.contains("step") ||
      !js["step"].is_number_integer() || !js.contains("data_position") ||
      !js["data_position"].is_number_integer()) {
    return absl::DataLossError(path + "/state.json: corrupt (needs integer step, data_position)");
  }
  out.state.step = js["step"].get<int64_t>();
  out.state.data_position = js["data_position"].get<int64_t>();
  out.state.tokens = js.value("tokens", int64_t{0});

  ASSIGN_OR_RETURN(auto weights, SafetensorsReader::Open(path + "/model"));
  ASSIGN_OR_RETURN(out.optimizer.master, ReadWeights(layout, *weights));
  ASSIGN_OR_RETURN(auto moments, SafetensorsReader::Open(path + "/optimizer.safetensors"));
  for (const ParamUnit& unit : layout.units()) {
    std::vector<float> m(unit.numel), v(unit.numel);
    for (const ParamEntry& e : unit.entries) {
      RETURN_IF_ERROR(moments->Read("m." + e.hf_name, e.shape, DType::kF32, m.data() + e.offset));
      RETURN_IF_ERROR(moments->Read("v." + e.hf_name, e.shape, DType::kF32, v.data() + e.offset));
    }
    out.optimizer.m.push_back(std::move(m));
    out.optimizer.v.push_back(std::move(v));
  }
  return out;
}

}  // namespace ithaca
