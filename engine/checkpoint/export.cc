#include "engine/checkpoint/export.h"

#include <algorithm>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/core/file_util.h"
#include "engine/model/config.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/params.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/checkpoint/checkpoint.h"

namespace ithaca {
namespace {

bool IsDir(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Whether `path` is an empty directory (false for anything else, including a missing path).
bool IsEmptyDir(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return false;
  bool empty = true;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  closedir(d);
  return empty;
}

absl::Status FsyncDir(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  const bool ok = fsync(fd) == 0;
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat("cannot fsync ", path, ": ", strerror(errno)));
  return absl::OkStatus();
}

// `path` split into its directory ("." when none) and last component, trailing slashes dropped.
std::pair<std::string, std::string> SplitPath(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// The checkpoint's hub-dialect config.json, saying which dtype the tensors are stored in (the
// checkpoint's own copy always says bfloat16, the dtype it trains in).
std::string ExportConfigJson(const LlamaConfig& cfg, DType dtype) {
  nlohmann::json j = nlohmann::json::parse(ConfigToJson(cfg));
  j["torch_dtype"] = dtype == DType::kF32 ? "float32" : "bfloat16";
  return j.dump(2) + "\n";
}

// W += scale · B · A when `e` is a linear the LoRA targets ("model.layers.N.<module>.weight"),
// its A and B read from `adapters` under the base's module name.
absl::Status MergeLora(const SafetensorsReader& adapters, const LoraConfig& lora,
                       const ParamEntry& e, std::vector<float>* w) {
  for (int t = 0; t < kNumLoraTargets; ++t) {
    const std::string suffix = absl::StrCat(".", LoraModulePath(t), ".weight");
    const std::string& name = e.hf_name;
    if (!lora.targets[t] || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    const int64_t out = e.shape[0], in = e.shape[1], r = lora.rank;
    std::vector<float> a(r * in), b(out * r);
    RETURN_IF_ERROR(adapters.Read(module + ".lora_A.weight", {r, in}, DType::kF32, a.data()));
    RETURN_IF_ERROR(adapters.Read(module + ".lora_B.weight", {out, r}, DType::kF32, b.data()));
    const double scale = lora.alpha / static_cast<double>(r);
    for (int64_t i = 0; i < out; ++i) {
      for (int64_t j = 0; j < in; ++j) {
        double sum = 0;
        for (int64_t k = 0; k < r; ++k) sum += double(b[i * r + k]) * a[k * in + j];
        (*w)[i * in + j] += static_cast<float>(scale * sum);
      }
    }
  }
  return absl::OkStatus();
}

// A LoRA checkpoint's adapters as a PEFT directory in `dir`.
absl::Status WritePeftExport(LlamaConfig cfg, const SafetensorsReader& reader,
                             const std::string& dir, const ExportOptions& options) {
  cfg.lora = options.lora;
  const ParamLayout layout(cfg);
  HostWeights units(layout.num_units());
  std::vector<const float*> ptrs(layout.num_units(), nullptr);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const int u = layout.lora_unit(l);
    units[u].resize(static_cast<size_t>(layout.units()[u].numel));
    RETURN_IF_ERROR(ReadUnitWeightsInto(layout, reader, u, units[u].data()));
    ptrs[u] = units[u].data();
  }
  return WritePeftAdapter(dir, cfg, layout, ptrs, options.peft_base_model);
}

// Writes the whole export into `dir` (which exists and is empty).
absl::Status WriteExport(const std::string& checkpoint, const std::string& dir,
                         const ExportOptions& options) {
  const std::string model = checkpoint + "/model";
  ASSIGN_OR_RETURN(LlamaConfig cfg, LoadConfigJson(model));
  const ParamLayout layout(cfg);
  ASSIGN_OR_RETURN(auto reader, SafetensorsReader::Open(model));
  if (!options.lora.enabled() && HoldsAdaptersOnly(*reader)) {
    return absl::FailedPreconditionError(absl::StrCat(
        checkpoint,
        " holds a LoRA run's adapters, and its state.json does not record the "
        "run's [lora] (a checkpoint saved before ithaca-export read them): export it with the "
        "run's checkpoint.export, or resume the run for a step to save a new checkpoint"));
  }
  if (options.lora.enabled() && options.lora_base.empty()) {
    return WritePeftExport(cfg, *reader, dir, options);
  }
  std::unique_ptr<SafetensorsReader> adapters;  // LoRA: the checkpoint's; `reader` the base's
  if (options.lora.enabled()) {
    adapters = std::move(reader);
    ASSIGN_OR_RETURN(reader, SafetensorsReader::Open(options.lora_base));
  }
  // Tensor by tensor from the checkpoint into the opened files: the host holds one tensor at a
  // time, not the model.
  SafetensorsWriter names;
  names.SetMetadata("format", "pt");
  for (const ParamUnit& unit : layout.units()) {
    for (const ParamEntry& e : unit.entries) {
      names.Add(e.hf_name, DType::kF32, e.shape, nullptr, options.dtype);
    }
  }
  ASSIGN_OR_RETURN(auto files, names.OpenSharded(dir, options.max_shard_bytes));
  std::vector<float> tensor;
  for (const ParamUnit& unit : layout.units()) {
    for (const ParamEntry& e : unit.entries) {
      tensor.resize(static_cast<size_t>(NumElements(e.shape)));
      RETURN_IF_ERROR(reader->Read(e.hf_name, e.shape, DType::kF32, tensor.data()));
      if (adapters) RETURN_IF_ERROR(MergeLora(*adapters, options.lora, e, &tensor));
      for (auto& file : files) {
        if (file->Holds(e.hf_name))
          RETURN_IF_ERROR(file->Put(e.hf_name, DType::kF32, tensor.data()));
      }
    }
  }
  for (auto& file : files) RETURN_IF_ERROR(file->Commit());
  RETURN_IF_ERROR(names.WriteShardedIndex(dir, options.max_shard_bytes));
  // A model trained past its config's context (a long-context phase) is exported as one that
  // serves that length: RoPE ([model.rope]) is already in cfg, as the checkpoint recorded it.
  LlamaConfig out_cfg = cfg;
  out_cfg.max_position_embeddings =
      std::max(out_cfg.max_position_embeddings, options.trained_seq_len);
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/config.json", ExportConfigJson(out_cfg, options.dtype)));
  if (!options.source_model_dir.empty()) {
    for (const char* name : kCopiedFiles) {
      const std::string src = options.source_model_dir + "/" + name;
      if (!PathExists(src)) continue;
      ASSIGN_OR_RETURN(std::string text, ReadFileToString(src));
      RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + name, text));
    }
  }
  return absl::OkStatus();
}

// Removes what a killed export to parent/name left behind (.name.tmp.PID, .name.old.PID).
absl::Status RemoveLeftovers(const std::string& parent, const std::string& name) {
  DIR* d = opendir(parent.c_str());
  if (d == nullptr) return absl::OkStatus();
  std::vector<std::string> stale;
  const std::string tmp = "." + name + ".tmp.", old = "." + name + ".old.";
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind(tmp, 0) == 0 || n.rfind(old, 0) == 0) stale.push_back(n);
  }
  closedir(d);
  for (const std::string& n : stale) RETURN_IF_ERROR(RemoveTreeNoFollow(parent + "/" + n));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DType> ParseExportDType(const std::string& name) {
  if (name == "bf16") return DType::kBF16;
  if (name == "f32") return DType::kF32;
  return absl::InvalidArgumentError(
      absl::StrCat("export dtype \"", name, "\": must be \"bf16\" or \"f32\""));
}

absl::StatusOr<std::string> FindCheckpoint(const std::string& path) {
  if (!IsDir(path)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such checkpoint directory"));
  }
  if (PathExists(path + "/manifest.json")) return path;
  if (PathExists(path + "/model") || PathExists(path + "/state.json")) {
    // A step directory without its manifest was never completed (or lost it).
    return absl::DataLossError(
        absl::StrCat(path, "/manifest.json: missing (an incomplete or damaged checkpoint)"));
  }
  absl::StatusOr<std::string> latest = LatestCheckpoint(path);
  if (!latest.ok()) {
    return absl::NotFoundError(absl::StrCat(
        path, ": no complete checkpoint (neither a step directory nor a checkpoint.dir with one)"));
  }
  return latest;
}

absl::Status ExportCheckpoint(const std::string& checkpoint, const std::string& out,
                              const ExportOptions& given) {
  ExportOptions options = given;
  // What the run recorded; a damaged state.json is named by VerifyCheckpoint below.
  TrainState state = ReadCheckpointState(checkpoint).value_or(TrainState());
  // A LoRA run's [lora], as its checkpoint recorded it.
  if (!options.lora.enabled()) options.lora = state.lora;
  if (!options.lora.enabled() && !options.lora_base.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a base to merge into (", options.lora_base, ") was given, but ", checkpoint,
                     " is not a LoRA run's checkpoint (its state.json records no [lora])"));
  }
  if (options.peft_base_model.empty()) options.peft_base_model = state.source_model;
  // Without a source model, the one the run started from (its checkpoint records it), while
  // that directory still exists.
  if (options.source_model_dir.empty() && !state.source_model.empty() &&
      IsDir(state.source_model)) {
    options.source_model_dir = state.source_model;
  }
  // A PEFT adapter directory holds the adapter alone: no tokenizer files.
  if (options.lora.enabled() && options.lora_base.empty()) options.source_model_dir.clear();
  if (options.dtype != DType::kBF16 && options.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("export dtype ", DTypeName(options.dtype), ": must be bf16 or f32"));
  }
  if (options.max_shard_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("export shard size must be > 0, got ", options.max_shard_bytes));
  }
  const auto [parent, name] = SplitPath(out);
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat(out, ": not a usable output directory name"));
  }
  if (!options.replace && PathExists(out) && !IsEmptyDir(out)) {
    return absl::AlreadyExistsError(
        absl::StrCat(out, ": exists and is not an empty directory (refusing to overwrite it)"));
  }
  if (!options.source_model_dir.empty() && !IsDir(options.source_model_dir)) {
    return absl::NotFoundError(
        absl::StrCat(options.source_model_dir, ": no such source model directory"));
  }
  RETURN_IF_ERROR(VerifyCheckpoint(checkpoint));
  RETURN_IF_ERROR(MakeDirs(parent));

  if (options.replace) RETURN_IF_ERROR(RemoveLeftovers(parent, name));
  const std::string tmp = absl::StrCat(parent, "/.", name, ".tmp.", getpid());
  RETURN_IF_ERROR(RemoveTreeNoFollow(tmp));
  absl::Status st = WriteExport(checkpoint, tmp, options);
  // Its entries are on disk before the directory gets its final name.
  if (st.ok()) st = FsyncDir(tmp);
  // Replacing: the old export moves aside first and is deleted only once the new one is in
  // place, so a kill never leaves half an export under `out` (at worst the old one, hidden).
  std::string old;
  if (st.ok() && options.replace && PathExists(out)) {
    old = absl::StrCat(parent, "/.", name, ".old.", getpid());
    st = RemoveTreeNoFollow(old);
    if (st.ok() && std::rename(out.c_str(), old.c_str()) != 0) {
      st = absl::InternalError(absl::StrCat("cannot rename ", out, ": ", std::strerror(errno)));
    }
  }
  // rename(2) replaces an empty directory, and fails on a non-empty one that appeared meanwhile.
  if (st.ok() && std::rename(tmp.c_str(), out.c_str()) != 0) {
    st = absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", out, ": ", std::strerror(errno)));
  }
  if (!st.ok()) {
    RemoveTreeNoFollow(tmp).IgnoreError();
    if (!old.empty() && !PathExists(out)) std::rename(old.c_str(), out.c_str());
    return st;
  }
  RETURN_IF_ERROR(FsyncDir(parent));
  if (!old.empty()) RETURN_IF_ERROR(RemoveTreeNoFollow(old));
  return st;
}

}  // namespace ithaca
