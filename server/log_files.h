// Per-rank log files (<state-dir>/jobs/<id>/rank-R.log: the worker's stdout and stderr), read
// incrementally in whole lines.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "launch/launcher.h"

namespace ithaca {

// Who may read a job's files (issue 53 N11): the daemon's user, and under --worker-user the
// workers' user only as far as they must go. `dir` (the state directory's jobs/ or a job's
// directory) is made if it is missing and given mode 0700, or, with `workers`, 0710 with their
// group: they pass through to their own rendezvous directory (theirs, 0700), nobody else lists
// or reads anything. FAILED_PRECONDITION when `dir` is a link or not a directory. Rank logs are
// 0600 (launch/launcher.h); nothing under the state directory is readable by other users.
absl::Status MakeJobsDir(const std::string& dir, const std::optional<RunAs>& workers);
// What an older daemon left readable under `jobs_dir` (0755 job directories, 0644 rank logs):
// each job's directory made as MakeJobsDir makes it, group and others' access taken from what is
// in it. Links are left alone (never followed).
void TightenJobDirs(const std::string& jobs_dir, const std::optional<RunAs>& workers);

class LogTail {
 public:
  explicit LogTail(std::string path) : path_(std::move(path)) {}
  // Complete lines appended since the last call (without their newlines). `flush` also returns
  // a final line that has no newline yet (when the writer is gone).
  std::vector<std::string> ReadLines(bool flush = false);
  // Starts from the file's current end (a daemon adopting a running job: what its predecessor
  // already read is not read again).
  void SkipToEnd();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  long long offset_ = 0;
  std::string partial_;
};

}  // namespace ithaca
