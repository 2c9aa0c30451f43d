// manifest.json: every file of a checkpoint with its size and CRC-32, written last at a save and
// verified at a load.
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
#include <zlib.h>

#include "engine/core/file_util.h"
#include "engine/model/safetensors.h"

namespace ithaca {
namespace checkpoint_internal {
namespace {

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

}  // namespace

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

}  // namespace checkpoint_internal

using checkpoint_internal::Checksum;
using checkpoint_internal::FileSum;
using checkpoint_internal::kManifest;
using checkpoint_internal::kManifestFormat;

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

absl::Status CheckManifestListsFiles(const std::string& path, const CheckpointManifest& manifest,
                                     const SafetensorsReader& reader) {
  const std::string prefix = path + "/";
  for (const std::string& file : reader.Files()) {
    const bool inside = absl::StartsWith(file, prefix);
    const std::string rel = inside ? file.substr(prefix.size()) : file;
    const bool listed =
        inside && std::any_of(manifest.files.begin(), manifest.files.end(),
                              [&](const CheckpointManifest::File& f) { return f.path == rel; });
    if (!listed) {
      return absl::DataLossError(absl::StrCat(path, "/", kManifest, ": does not list ", rel,
                                              ", which its tensors are read from: "
                                              "not a whole checkpoint"));
    }
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

}  // namespace ithaca
