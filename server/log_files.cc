#include "server/log_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ithaca {

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
