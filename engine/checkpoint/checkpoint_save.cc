// Saving a checkpoint: the files split among the ranks by tensor, each rank's shard written as its
// tensors arrive, and rank 0's commit (the manifest, the rename into place, the pruning).
#include "engine/checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

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
#include "engine/checkpoint/tensor_writer.h"
#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "engine/core/units.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace ithaca {
namespace {

using checkpoint_internal::Checksum;
using checkpoint_internal::Errno;
using checkpoint_internal::FileSum;
using checkpoint_internal::FsyncPath;
using checkpoint_internal::ListCheckpoints;
using checkpoint_internal::MoveToTrashAndRemove;
using checkpoint_internal::SecondsSince;
using checkpoint_internal::StepDirName;
using checkpoint_internal::WriteManifest;

// Each rank's checksums of the files it wrote, for the manifest: a hidden file in the
// temporary checkpoint, removed before the manifest lists the files.
std::string SumsPath(const std::string& tmp, int rank) {
  return absl::StrCat(tmp, "/.sums-rank-", rank, ".json");
}

// Files of at most 4 GiB (as transformers shards), and as many for every writer (at least one):
// the writers then hold and write equal shares.
constexpr int64_t kMaxFileBytes = 4 * kGiBBytes;
int FileCount(int64_t bytes, int world) {
  const int64_t files = std::max<int64_t>(1, (bytes + kMaxFileBytes - 1) / kMaxFileBytes);
  return static_cast<int>((files + world - 1) / world * world);
}

// The rank that writes file (part) f of model/ or optimizer/.
int WriterOf(int part, int world) { return part % world; }

// How a checkpoint saved at `world` is split into files: every tensor in file order (weights in
// model/; the Adam moments, m then v of each weight, in optimizer/), names and shapes only (the
// data is put into the opened files piece by piece), and which part (file) each goes to.
struct FileSplit {
  SafetensorsWriter weights, moments;
  int weight_files = 1, moment_files = 1;
  std::vector<int> weight_part, moment_part;  // in insertion order
};

FileSplit SplitFiles(const ParamLayout& layout, int world) {
  FileSplit split;
  split.weights.SetMetadata("format", "pt");
  int64_t weight_bytes = 0;
  for (const ParamUnit& unit : layout.units()) {
    if (!unit.trainable) continue;  // a frozen base (LoRA) is the model's, not the run's
    for (const ParamEntry& e : unit.entries) {
      split.weights.Add(e.hf_name, DType::kF32, e.shape, nullptr, DType::kF32);
      split.moments.Add("m." + e.hf_name, DType::kF32, e.shape, nullptr, DType::kF32);
      split.moments.Add("v." + e.hf_name, DType::kF32, e.shape, nullptr, DType::kF32);
      weight_bytes += NumElements(e.shape) * 4;
    }
  }
  split.weight_files = FileCount(weight_bytes, world);
  split.moment_files = FileCount(2 * weight_bytes, world);
  split.weight_part = split.weights.PartOfEachTensor(split.weight_files);
  split.moment_part = split.moments.PartOfEachTensor(split.moment_files);
  return split;
}

}  // namespace

std::string CheckpointTempPath(const std::string& dir, const TrainState& state) {
  // The same name on every rank (and node) without talking, and a different one for each run:
  // two runs never write into, or clean up, each other's save. A run without an id: "save".
  std::string tag = "save";
  if (!state.run_id.empty()) {
    const auto* id = reinterpret_cast<const Bytef*>(state.run_id.data());
    tag = absl::StrFormat("%08x", crc32_z(0L, id, state.run_id.size()));
  }
  return absl::StrCat(dir, "/.", StepDirName(state.step), ".tmp.", tag);
}

CheckpointSaveLock::~CheckpointSaveLock() {
  if (fd_ >= 0) close(fd_);
}

CheckpointSaveLock& CheckpointSaveLock::operator=(CheckpointSaveLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

absl::StatusOr<CheckpointSaveLock> BeginCheckpoint(const std::string& dir,
                                                   const TrainState& state) {
  // Under ithacad the directory is checked against its roots before every save, and made one
  // component at a time without following links (engine/core/path_policy.h).
  ASSIGN_OR_RETURN(std::vector<std::string> roots, AllowedRootsFromEnvironment());
  RETURN_IF_ERROR(roots.empty() ? MakeDirs(dir) : MakeDirsInsideRoots(dir, roots));
  RETURN_IF_ERROR(RemoveStaleCheckpointFiles(dir));
  const std::string tmp = CheckpointTempPath(dir, state);
  RETURN_IF_ERROR(MakeDirs(tmp));
  const int fd = open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", tmp);
  CheckpointSaveLock lock(fd);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) return Errno("cannot lock", tmp);
  return lock;
}

void AbandonCheckpoint(const std::string& dir, const TrainState& state) {
  RemoveTreeNoFollow(CheckpointTempPath(dir, state)).IgnoreError();
}

OptimizerSelection CheckpointTensorsOf(const ParamLayout& layout, int rank, int world) {
  const FileSplit split = SplitFiles(layout, world);
  OptimizerSelection mine;
  size_t i = 0;
  for (const ParamUnit& unit : layout.units()) {
    if (!unit.trainable) continue;  // as SplitFiles
    for (const ParamEntry& e : unit.entries) {
      if (WriterOf(split.weight_part[i], world) == rank) mine.master.insert(e.hf_name);
      if (WriterOf(split.moment_part[2 * i], world) == rank) mine.m.insert(e.hf_name);
      if (WriterOf(split.moment_part[2 * i + 1], world) == rank) mine.v.insert(e.hf_name);
      ++i;
    }
  }
  return mine;
}

OptimizerState StateOfWholeUnits(const ParamLayout& layout, const OptimizerShards& whole) {
  OptimizerState s;
  for (size_t u = 0; u < layout.units().size(); ++u) {
    if (!layout.units()[u].trainable) continue;
    for (const ParamEntry& e : layout.units()[u].entries) {
      const int64_t n = NumElements(e.shape);
      for (auto [from, to] :
           {std::pair{&whole.master, &s.master}, {&whole.m, &s.m}, {&whole.v, &s.v}}) {
        const float* p = (*from)[u].data() + e.offset;
        (*to)[e.hf_name].assign(p, p + n);
      }
    }
  }
  return s;
}

absl::StatusOr<CheckpointWriteReport> WriteCheckpointShard(
    const std::string& dir, const LlamaConfig& cfg, const ParamLayout& layout,
    const OptimizerState& opt, const TrainState& state, int rank, int world) {
  // The sizes of what `opt` holds are checked here, also those of tensors other ranks write.
  for (const auto* kind : {&opt.master, &opt.m, &opt.v}) {
    for (const ParamUnit& unit : layout.units()) {
      for (const ParamEntry& e : unit.entries) {
        auto it = kind->find(e.hf_name);
        if (it != kind->end() && static_cast<int64_t>(it->second.size()) != NumElements(e.shape)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "checkpoint: tensor '", e.hf_name, "' has ", it->second.size(),
              " elements, its shape ", ShapeString(e.shape), " needs ", NumElements(e.shape)));
        }
      }
    }
  }
  const OptimizerSelection share = CheckpointTensorsOf(layout, rank, world);
  return WriteCheckpointShardFrom(
      dir, cfg, layout, state, rank, world, [&](const OptimizerTensorSink& sink) {
        for (auto [names, held, kind] : {std::tuple{&share.master, &opt.master, "master"},
                                         {&share.m, &opt.m, "m"},
                                         {&share.v, &opt.v, "v"}}) {
          for (const std::string& name : *names) {
            auto it = held->find(name);
            if (it == held->end()) {
              return absl::InvalidArgumentError(
                  absl::StrCat("checkpoint: tensor '", name, "' (", kind,
                               ") of this rank's share: no data to write (the state lacks it)"));
            }
            std::vector<float> copy = it->second;  // a sink may keep what it is given
            RETURN_IF_ERROR(sink(kind, name, std::move(copy)));
          }
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<CheckpointWriteReport> WriteCheckpointShardFrom(
    const std::string& dir, const LlamaConfig& cfg, const ParamLayout& layout,
    const TrainState& state, int rank, int world, const CheckpointProducer& produce) {
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: rank ", rank, " is not a rank of a world of ", world));
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string tmp = CheckpointTempPath(dir, state);
  const FileSplit split = SplitFiles(layout, world);
  const int weight_files = split.weight_files, moment_files = split.moment_files;
  // This rank's files, opened with their headers; the tensors come from `produce`.
  std::vector<std::unique_ptr<SafetensorsPieceWriter>> files;
  std::vector<std::string> mine;  // paths relative to tmp
  auto open = [&](absl::StatusOr<std::unique_ptr<SafetensorsPieceWriter>> file,
                  const std::string& folder) -> absl::Status {
    RETURN_IF_ERROR(file.status());
    mine.push_back(folder + (*file)->name());
    files.push_back(std::move(*file));
    return absl::OkStatus();
  };
  absl::Status opened;
  for (int f = 0; f < weight_files && opened.ok(); ++f) {
    if (WriterOf(f, world) != rank) continue;
    opened = open(split.weights.OpenShard(tmp + "/model", f, weight_files), "model/");
  }
  if (moment_files == 1) {
    if (opened.ok()) opened = open(split.moments.OpenFile(tmp + "/optimizer.safetensors"), "");
  } else {
    for (int f = 0; f < moment_files && opened.ok(); ++f) {
      if (WriterOf(f, world) != rank) continue;
      opened = open(split.moments.OpenShard(tmp + "/optimizer", f, moment_files), "optimizer/");
    }
  }
  if (!opened.ok()) {
    // `produce` runs all the same: its gathers are collective, the other ranks need this one.
    (void)produce([&](const char*, const std::string&, std::vector<float>&&) { return opened; });
    return opened;
  }
  std::map<std::string, const ParamEntry*> entries;
  for (const ParamUnit& unit : layout.units()) {
    for (const ParamEntry& e : unit.entries) entries[e.hf_name] = &e;
  }
  TensorWriter writer(
      [&](size_t file, const std::string& tensor, const std::vector<float>& values) {
        return files[file]->Put(tensor, DType::kF32, values.data());
      },
      kCheckpointWriteQueueBytes);
  absl::Status produced = produce(
      [&](const char* kind, const std::string& name, std::vector<float>&& values) -> absl::Status {
        auto e = entries.find(name);
        if (e == entries.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("checkpoint: tensor '", name, "' is not one of the model's"));
        }
        const int64_t want = NumElements(e->second->shape);
        if (static_cast<int64_t>(values.size()) != want) {
          return absl::InvalidArgumentError(absl::StrCat(
              "checkpoint: tensor '", name, "' has ", values.size(), " elements, its shape ",
              ShapeString(e->second->shape), " needs ", want));
        }
        const std::string tensor = std::string_view(kind) == "master" ? name : kind + ("." + name);
        for (size_t f = 0; f < files.size(); ++f) {
          if (files[f]->Holds(tensor)) return writer.Push(f, tensor, std::move(values));
        }
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint: tensor '", tensor, "' is not in rank ", rank, "'s files"));
      });
  absl::Status written = writer.Finish();
  RETURN_IF_ERROR(produced);
  RETURN_IF_ERROR(written);
  // A tensor of this rank's share that never came fails here, naming it.
  for (auto& file : files) RETURN_IF_ERROR(file->Commit());
  if (rank == 0) {
    RETURN_IF_ERROR(split.weights.WriteShardIndex(tmp + "/model", weight_files));
    if (moment_files > 1)
      RETURN_IF_ERROR(split.moments.WriteShardIndex(tmp + "/optimizer", moment_files));
    RETURN_IF_ERROR(WriteFileAtomic(tmp + "/model/config.json", ConfigToJson(cfg)));
    nlohmann::json js = {{"step", state.step},
                         {"data_position", state.data_position},
                         {"tokens", state.tokens},
                         {"schedule_steps", state.schedule_steps},
                         {"lr", state.lr},
                         {"run_id", state.run_id},
                         {"source_model", state.source_model},
                         {"world", world},
                         {"format", "ithaca-checkpoint-v1"}};
    if (state.lora.enabled()) {
      js["lora"] = {{"r", state.lora.rank},
                    {"lora_alpha", state.lora.alpha},
                    {"target_modules", LoraTargetNames(state.lora)}};
    }
    RETURN_IF_ERROR(WriteFileAtomic(tmp + "/state.json", js.dump(2) + "\n"));
  }
  // Checksummed here, in parallel with the other ranks, rather than all by rank 0 at commit.
  CheckpointWriteReport report;
  nlohmann::json sums = nlohmann::json::array();
  for (const std::string& f : mine) {
    ASSIGN_OR_RETURN(FileSum sum, Checksum(tmp + "/" + f));
    sums.push_back({{"path", f}, {"bytes", sum.bytes}, {"crc32", sum.crc}});
    report.bytes += sum.bytes;
  }
  RETURN_IF_ERROR(WriteFileAtomic(SumsPath(tmp, rank), sums.dump() + "\n"));
  report.seconds = SecondsSince(start);
  report.queued_bytes = writer.peak_bytes();
  return report;
}

absl::StatusOr<CheckpointWriteReport> CommitCheckpoint(const std::string& dir,
                                                       const TrainState& state, int world,
                                                       int64_t keep) {
  const auto start = std::chrono::steady_clock::now();
  const std::string name = StepDirName(state.step);
  const std::string final_path = dir + "/" + name;
  const std::string tmp = CheckpointTempPath(dir, state);
  auto fail = [&](absl::Status st) {
    RemoveTreeNoFollow(tmp).IgnoreError();
    return st;
  };
  std::map<std::string, FileSum> known;
  for (int r = 0; r < world; ++r) {
    const std::string path = SumsPath(tmp, r);
    absl::StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) {
      return fail(absl::DataLossError(absl::StrCat("checkpoint ", tmp, ": rank ", r,
                                                   " did not finish writing its share (", path,
                                                   ": ", text.status().message(), ")")));
    }
    nlohmann::json js = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!js.is_array()) return fail(absl::DataLossError(path + ": corrupt"));
    for (const nlohmann::json& f : js) {
      if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("bytes") ||
          !f["bytes"].is_number_integer() || !f.contains("crc32") ||
          !f["crc32"].is_number_unsigned()) {
        return fail(absl::DataLossError(path + ": corrupt entry " + f.dump()));
      }
      known[f["path"].get<std::string>()] = {f["bytes"].get<int64_t>(), f["crc32"].get<uint32_t>()};
    }
    if (std::remove(path.c_str()) != 0) return fail(Errno("cannot remove", path));
  }
  absl::StatusOr<int64_t> bytes = WriteManifest(tmp, known);
  if (!bytes.ok()) return fail(bytes.status());
  // The same step saved again (a resumed job re-reaching it) replaces the old copy.
  absl::Status st = MoveToTrashAndRemove(dir, name);
  if (!st.ok()) return fail(st);
  if (std::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return fail(absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", final_path)));
  }
  RETURN_IF_ERROR(FsyncPath(dir));
  std::vector<std::string> all = ListCheckpoints(dir);
  for (size_t i = 0; i + keep < all.size(); ++i) {
    RETURN_IF_ERROR(MoveToTrashAndRemove(dir, all[i]));
  }
  CheckpointWriteReport report;
  report.bytes = *bytes;
  report.seconds = SecondsSince(start);
  return report;
}

absl::Status SaveCheckpoint(const std::string& dir, const LlamaConfig& cfg,
                            const ParamLayout& layout, const OptimizerState& opt,
                            const TrainState& state, int64_t keep) {
  ASSIGN_OR_RETURN(CheckpointSaveLock lock, BeginCheckpoint(dir, state));
  absl::StatusOr<CheckpointWriteReport> wrote =
      WriteCheckpointShard(dir, cfg, layout, opt, state, /*rank=*/0, /*world=*/1);
  if (!wrote.ok()) {
    AbandonCheckpoint(dir, state);
    return wrote.status();
  }
  return CommitCheckpoint(dir, state, /*world=*/1, keep).status();
}

}  // namespace ithaca
