// Per-rank log files (<state-dir>/jobs/<id>/rank-R.log: the worker's stdout and stderr), read
// incrementally in whole lines.
#pragma once

#include <string>
#include <vector>

namespace ithaca {

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
