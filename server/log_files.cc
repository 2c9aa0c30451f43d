#include "server/log_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/core/file_util.h"

namespace ithaca {
namespace {

// Sets `dir`'s mode (and with `workers`, its group) as MakeJobsDir says; `dir` is a directory.
absl::Status RestrictJobsDir(const std::string& dir, const std::optional<RunAs>& workers) {
  if (workers && chown(dir.c_str(), static_cast<uid_t>(-1), workers->gid) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("chgrp ", dir, " to ", workers->name, "'s group: ", std::strerror(errno)));
  }
  const mode_t mode = workers ? 0710 : 0700;
  if (chmod(dir.c_str(), mode) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("chmod ", dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool IsDirectoryNoFollow(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::Status MakeJobsDir(const std::string& dir, const std::optional<RunAs>& workers) {
  RETURN_IF_ERROR(MakeDirs(dir));
  if (!IsDirectoryNoFollow(dir)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, ": not a directory (or a link)"));
  }
  return RestrictJobsDir(dir, workers);
}

void TightenJobDirs(const std::string& jobs_dir, const std::optional<RunAs>& workers) {
  DIR* d = opendir(jobs_dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> jobs;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != ".." && IsDirectoryNoFollow(jobs_dir + "/" + name)) {
      jobs.push_back(jobs_dir + "/" + name);
    }
  }
  closedir(d);
  for (const std::string& job : jobs) {
    RestrictJobsDir(job, workers).IgnoreError();  // best effort: the next start tries again
    DIR* j = opendir(job.c_str());
    if (j == nullptr) continue;
    while (dirent* e = readdir(j)) {
      const std::string path = job + "/" + e->d_name;
      struct stat st;
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0 ||
          lstat(path.c_str(), &st) != 0 || S_ISLNK(st.st_mode) || (st.st_mode & 077) == 0) {
        continue;
      }
      chmod(path.c_str(), st.st_mode & 07700);
    }
    closedir(j);
  }
}

std::vector<std::string> LogTail::ReadLines(bool flush) {
  std::vector<std::string> lines;
  int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[1 << 16];
    ssize_t n;
    while ((n = pread(fd, buf, sizeof(buf), offset_)) > 0) {
      offset_ += n;
      partial_.append(buf, n);
    }
    close(fd);
  }
  size_t start = 0, nl;
  while ((nl = partial_.find('\n', start)) != std::string::npos) {
    lines.push_back(partial_.substr(start, nl - start));
    start = nl + 1;
  }
  partial_.erase(0, start);
  if (flush && !partial_.empty()) {
    lines.push_back(partial_);
    partial_.clear();
  }
  return lines;
}

void LogTail::SkipToEnd() {
  struct stat st;
  if (stat(path_.c_str(), &st) == 0) offset_ = st.st_size;
  partial_.clear();
}

}  // namespace ithaca
