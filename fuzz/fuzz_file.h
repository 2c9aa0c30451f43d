// The safetensors and token-file readers open paths (they mmap the file), so their harnesses
// write each input to a file of their own first.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ithaca::fuzz {

// A per-process file under $TMPDIR (or /tmp), rewritten with every input and removed at exit.
class InputFile {
 public:
  explicit InputFile(const char* suffix) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/ithaca_fuzz." + std::to_string(getpid()) +
            suffix;
  }
  ~InputFile() { unlink(path_.c_str()); }

  // Aborts on an I/O error: a fuzz run must not silently test an empty file.
  const std::string& Write(const uint8_t* data, size_t size) {
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
      std::perror(path_.c_str());
      std::abort();
    }
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd, data + done, size - done);
      if (n <= 0) {
        std::perror(path_.c_str());
        std::abort();
      }
      done += static_cast<size_t>(n);
    }
    close(fd);
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace ithaca::fuzz
