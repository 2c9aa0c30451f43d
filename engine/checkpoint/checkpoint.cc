// The checkpoint directory: its steps, removing (never following a link), what killed saves
// left behind, and a step's tree checked before anything in it is read.
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

namespace ithaca {
namespace checkpoint_internal {

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

namespace {

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

}  // namespace

absl::Status FsyncPath(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const bool ok = fsync(fd) == 0;
  close(fd);
  return ok ? absl::OkStatus() : Errno("cannot fsync", path);
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

}  // namespace checkpoint_internal

using checkpoint_internal::Errno;
using checkpoint_internal::kPrefix;
using checkpoint_internal::kTrashPrefix;
using checkpoint_internal::ListCheckpoints;
using checkpoint_internal::RemoveAt;

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

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir) {
  std::vector<std::string> all = ListCheckpoints(dir);
  if (all.empty()) return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  return dir + "/" + all.back();
}

namespace {

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

}  // namespace

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

}  // namespace ithaca
