#include "engine/checkpoint/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <map>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>
#include <tuple>
#include <utility>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/match.h"
#include "engine/core/file_util.h"
#include "engine/core/path_policy.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/checkpoint/tensor_writer.h"

namespace ithaca {
namespace {

constexpr char kPrefix[] = "step-";
constexpr char kManifest[] = "manifest.json";
constexpr char kManifestFormat[] = "ithaca-manifest-v1";
constexpr char kTrashPrefix[] = ".trash-";

std::string StepDirName(int64_t step) { return absl::StrFormat("%s%08d", kPrefix, step); }

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Completed checkpoints (step-NNNNNNNN with a manifest), oldest first.
std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n.rfind(kPrefix, 0) == 0 && n.find('.') == std::string::npos &&
        IsRegularFile(dir + "/" + n + "/" + kManifest)) {
      names.push_back(n);
    }
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Removes the entry `name` of the directory open as `dirfd`. Directories are opened with
// O_NOFOLLOW and walked through their descriptors, so no symbolic link is ever followed, even
// one swapped in while we walk.
absl::Status RemoveAt(int dirfd, const std::string& name, const std::string& shown) {
  struct stat st;
  if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? absl::OkStatus() : Errno("cannot stat", shown);
  }
  if (!S_ISDIR(st.st_mode)) {  // a file, a link, anything else: unlink the name itself
    if (unlinkat(dirfd, name.c_str(), 0) != 0 && errno != ENOENT) {
      return Errno("cannot remove", shown);
    }
    return absl::OkStatus();
  }
  const int fd = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", shown);
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return Errno("cannot list", shown);
  }
  std::vector<std::string> children;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      children.push_back(e->d_name);
    }
  }
  absl::Status status;
  for (const std::string& c : children) status.Update(RemoveAt(::dirfd(d), c, shown + "/" + c));
  closedir(d);
  RETURN_IF_ERROR(status);
  if (unlinkat(dirfd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return Errno("cannot remove", shown);
  }
  return absl::OkStatus();
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const bool ok = fsync(fd) == 0;
  close(fd);
  return ok ? absl::OkStatus() : Errno("cannot fsync", path);
}

struct FileSum {
  int64_t bytes = 0;
  uint32_t crc = 0;
};

absl::StatusOr<FileSum> Checksum(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::DataLossError(path + ": missing");
    return Errno("cannot open", path);
  }
  FileSum sum;
  uLong crc = crc32_z(0L, Z_NULL, 0);
  std::vector<unsigned char> buf(size_t{4} << 20);
  for (;;) {
    const ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      close(fd);
      return Errno("cannot read", path);
    }
    if (n == 0) break;
    crc = crc32_z(crc, buf.data(), static_cast<size_t>(n));
    sum.bytes += n;
  }
  close(fd);
  sum.crc = static_cast<uint32_t>(crc);
  return sum;
}

// Every regular file under `root`, as paths relative to it, sorted.
absl::Status ListFiles(const std::string& root, const std::string& rel,
                       std::vector<std::string>* out) {
  const std::string path = rel.empty() ? root : root + "/" + rel;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return Errno("cannot list", path);
  std::vector<std::string> children;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      children.push_back(e->d_name);
    }
  }
  closedir(d);
  std::sort(children.begin(), children.end());
  for (const std::string& c : children) {
    const std::string child_rel = rel.empty() ? c : rel + "/" + c;
    struct stat st;
    if (lstat((root + "/" + child_rel).c_str(), &st) != 0) return Errno("cannot stat", child_rel);
    if (S_ISDIR(st.st_mode)) {
      RETURN_IF_ERROR(ListFiles(root, child_rel, out));
    } else if (S_ISREG(st.st_mode)) {
      out->push_back(child_rel);
    } else {
      return absl::InternalError(
          absl::StrCat(root, "/", child_rel, ": not a regular file in a checkpoint being written"));
    }
  }
  return absl::OkStatus();
}

// Writes manifest.json listing every file under `root` (written last, after the data is
// fsynced), then fsyncs every directory of the tree.
// `known`: sums the ranks computed for the files they wrote, so that only the rest is read here.
absl::StatusOr<int64_t> WriteManifest(const std::string& root,
                                      const std::map<std::string, FileSum>& known) {
  std::vector<std::string> files;
  RETURN_IF_ERROR(ListFiles(root, "", &files));
  nlohmann::json list = nlohmann::json::array();
  std::vector<std::string> dirs = {root};
  int64_t total = 0;
  for (const std::string& f : files) {
    FileSum sum;
    if (auto it = known.find(f); it != known.end()) {
      sum = it->second;
    } else {
      ASSIGN_OR_RETURN(sum, Checksum(root + "/" + f));
    }
    total += sum.bytes;
    list.push_back({{"path", f}, {"bytes", sum.bytes}, {"crc32", sum.crc}});
    const size_t slash = f.rfind('/');
    if (slash != std::string::npos) dirs.push_back(root + "/" + f.substr(0, slash));
  }
  for (const std::string& d : dirs) RETURN_IF_ERROR(FsyncPath(d));
  nlohmann::json js = {{"format", kManifestFormat}, {"files", list}};
  RETURN_IF_ERROR(WriteFileAtomic(root + "/" + kManifest, js.dump(1) + "\n"));
  RETURN_IF_ERROR(FsyncPath(root));
  return total;
}

// Each rank's checksums of the files it wrote, for the manifest: a hidden file in the
// temporary checkpoint, removed before the manifest lists the files.
std::string SumsPath(const std::string& tmp, int rank) {
  return absl::StrCat(tmp, "/.sums-rank-", rank, ".json");
}

// Files of at most 4 GiB (as transformers shards), and as many for every writer (at least one):
// the writers then hold and write equal shares.
constexpr int64_t kMaxFileBytes = int64_t{4} << 30;
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

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Renames dir/name to a hidden trash name, then deletes it: a kill in between leaves only trash,
// never a half-deleted checkpoint that still lists as complete.
absl::Status MoveToTrashAndRemove(const std::string& dir, const std::string& name) {
  const std::string trash = absl::StrCat(dir, "/", kTrashPrefix, name, ".", getpid());
  RETURN_IF_ERROR(RemoveTreeNoFollow(trash));
  if (std::rename((dir + "/" + name).c_str(), trash.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Errno("cannot rename", dir + "/" + name);
  }
  RETURN_IF_ERROR(FsyncPath(dir));
  return RemoveTreeNoFollow(trash);
}

}  // namespace

absl::Status RemoveTreeNoFollow(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  const std::string parent =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("refusing to remove \"", path, "\""));
  }
  const int fd = open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? absl::OkStatus() : Errno("cannot open", parent);
  absl::Status st = RemoveAt(fd, name, path);
  close(fd);
  return st;
}

absl::Status RemoveStaleCheckpointFiles(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::OkStatus();
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    const bool tmp = n.rfind(std::string(".") + kPrefix, 0) == 0 && n.find(".tmp.") != n.npos;
    if (tmp || n.rfind(kTrashPrefix, 0) == 0) stale.push_back(n);
  }
  closedir(d);
  for (const std::string& n : stale) {
    // A temporary whose save is live (its CheckpointSaveLock held, by another run sharing the
    // directory) is that run's, not stale: left alone.
    const std::string path = dir + "/" + n;
    const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {
      close(fd);
      continue;
    }
    absl::Status removed = RemoveTreeNoFollow(path);
    if (fd >= 0) close(fd);
    RETURN_IF_ERROR(removed);
  }
  return absl::OkStatus();
}

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

Optimizer::Selection CheckpointTensorsOf(const ParamLayout& layout, int rank, int world) {
  const FileSplit split = SplitFiles(layout, world);
  Optimizer::Selection mine;
  size_t i = 0;
  for (const ParamUnit& unit : layout.units()) {
    for (const ParamEntry& e : unit.entries) {
      if (WriterOf(split.weight_part[i], world) == rank) mine.master.insert(e.hf_name);
      if (WriterOf(split.moment_part[2 * i], world) == rank) mine.m.insert(e.hf_name);
      if (WriterOf(split.moment_part[2 * i + 1], world) == rank) mine.v.insert(e.hf_name);
      ++i;
    }
  }
  return mine;
}

Optimizer::State StateOfWholeUnits(const ParamLayout& layout, const Optimizer::Shards& whole) {
  Optimizer::State s;
  for (size_t u = 0; u < layout.units().size(); ++u) {
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
    const Optimizer::State& opt, const TrainState& state, int rank, int world) {
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
  const Optimizer::Selection share = CheckpointTensorsOf(layout, rank, world);
  return WriteCheckpointShardFrom(
      dir, cfg, layout, state, rank, world, [&](const Optimizer::TensorSink& sink) {
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
                            const ParamLayout& layout, const Optimizer::State& opt,
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

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  std::vector<std::string> all = ListCheckpoints(dir);
  if (all.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  return dir + "/" + all.back();
}

// A step directory holds only directories and regular files: a symbolic link (`model -> /etc`)
// would have a resume read, and its reason describe, a file outside the checkpoint. Walked through
// descriptors opened with O_NOFOLLOW, bounded in depth and entries.
absl::Status CheckStepTree(int dirfd, const std::string& shown, int depth, int64_t* entries) {
  constexpr int kMaxDepth = 8;
  constexpr int64_t kMaxEntries = 1 << 20;
  DIR* d = fdopendir(dirfd);
  if (d == nullptr) {
    close(dirfd);
    return Errno("cannot list", shown);
  }
  absl::Status status;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string entry = shown + "/" + name;
    if (++*entries > kMaxEntries) {
      status = absl::DataLossError(
          absl::StrCat(shown, ": more than ", kMaxEntries, " entries: not a checkpoint"));
      break;
    }
    struct stat st;
    if (fstatat(::dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      status = Errno("cannot stat", entry);
      break;
    }
    if (S_ISREG(st.st_mode)) continue;
    if (!S_ISDIR(st.st_mode)) {
      status = absl::DataLossError(absl::StrCat(
          entry, ": ", S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file",
          "; a checkpoint holds only files and directories, and links are not followed"));
      break;
    }
    if (depth >= kMaxDepth) {
      status = absl::DataLossError(absl::StrCat(entry, ": nested too deep: not a checkpoint"));
      break;
    }
    const int fd =
        openat(::dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      status = Errno("cannot open", entry);
      break;
    }
    status = CheckStepTree(fd, entry, depth + 1, entries);
    if (!status.ok()) break;
  }
  closedir(d);
  return status;
}

absl::Status CheckCheckpointStep(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return absl::DataLossError(absl::StrCat(
          path, ": not a directory (a checkpoint step is one; links are not followed)"));
    }
    return Errno("cannot open", path);
  }
  int64_t entries = 0;
  return CheckStepTree(fd, path, 0, &entries);
}

absl::StatusOr<CheckpointManifest> ReadCheckpointManifest(const std::string& path) {
  RETURN_IF_ERROR(CheckCheckpointStep(path));
  const std::string manifest_path = path + "/" + kManifest;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(manifest_path, kMaxIndexBytes));
  nlohmann::json js = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (js.is_discarded() || !js.is_object() || js.value("format", "") != kManifestFormat ||
      !js.contains("files") || !js["files"].is_array()) {
    return absl::DataLossError(manifest_path + ": corrupt (expected format " +
                               std::string(kManifestFormat) + " with a files list)");
  }
  CheckpointManifest manifest;
  for (const nlohmann::json& f : js["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_integer() || !f.contains("crc32") ||
        !f["crc32"].is_number_unsigned()) {
      return absl::DataLossError(manifest_path + ": corrupt entry " + f.dump());
    }
    const std::string rel = f["path"].get<std::string>();
    if (rel.empty() || rel[0] == '/' || rel.find("..") != std::string::npos) {
      return absl::DataLossError(manifest_path + ": bad path \"" + rel + "\"");
    }
    manifest.files.push_back({rel, f["bytes"].get<int64_t>(), f["crc32"].get<uint32_t>()});
    manifest.total_bytes += manifest.files.back().bytes;
  }
  // What every checkpoint holds must be listed, or verifying checks nothing of it (a manifest of
  // no files verified nothing, and a resume loaded whatever the step held: issue 43 N17).
  auto listed = [&](auto&& match) {
    return std::any_of(manifest.files.begin(), manifest.files.end(),
                       [&](const CheckpointManifest::File& f) { return match(f.path); });
  };
  const std::pair<const char*, bool> needed[] = {
      {"state.json", listed([](const std::string& p) { return p == "state.json"; })},
      {"the weights (model/)",
       listed([](const std::string& p) { return absl::StartsWith(p, "model/"); })},
      {"the optimizer's state (optimizer.safetensors or optimizer/)",
       listed([](const std::string& p) {
         return p == "optimizer.safetensors" || absl::StartsWith(p, "optimizer/");
       })}};
  for (const auto& [what, present] : needed) {
    if (!present) {
      return absl::DataLossError(
          absl::StrCat(manifest_path, ": does not list ", what, ": not a whole checkpoint"));
    }
  }
  return manifest;
}

std::vector<int> VerifierOfEachFile(const CheckpointManifest& manifest, int world) {
  const size_t n = manifest.files.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return manifest.files[a].bytes > manifest.files[b].bytes;
  });
  std::vector<int> verifier(n, 0);
  std::vector<int64_t> load(std::max(world, 1), 0);
  for (size_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    verifier[i] = r;
    load[r] += manifest.files[i].bytes;
  }
  return verifier;
}

absl::Status VerifyCheckpointFile(const std::string& path, const CheckpointManifest& manifest,
                                  size_t i) {
  const CheckpointManifest::File& f = manifest.files.at(i);
  const std::string file = path + "/" + f.path;
  ASSIGN_OR_RETURN(FileSum sum, Checksum(file));
  // The reasons say what is wrong, not the file's size or checksum: a reason reaches whoever
  // submitted the job, and facts about a file are not theirs to learn (issue 43 N6).
  if (sum.bytes != f.bytes) {
    return absl::DataLossError(
        absl::StrCat(file, ": not the size the manifest says (truncated?): corrupt"));
  }
  if (sum.crc != f.crc32) {
    return absl::DataLossError(absl::StrCat(file, ": not the checksum the manifest says: corrupt"));
  }
  return absl::OkStatus();
}

absl::Status VerifyCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ReadCheckpointManifest(path));
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    RETURN_IF_ERROR(VerifyCheckpointFile(path, manifest, i));
  }
  return absl::OkStatus();
}

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
  return state;
}

absl::StatusOr<LoadedCheckpoint> LoadCheckpointSlices(const std::string& path,
                                                      const ParamLayout& layout,
                                                      const std::vector<UnitSlice>& slices,
                                                      const Optimizer::UnitSink& sink) {
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
