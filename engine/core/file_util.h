// Files: whole-file reads and atomic writes (temporary name in the same directory, fsync, rename),
// so a crash or an error never leaves a partial file under the final name.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "engine/core/status.h"

namespace ithaca {

// Inputs (specs, configs, weights, data) must be regular files: a FIFO would hang the reader
// and a device would never end. Opens `path` for reading without blocking and returns the
// descriptor (the caller closes it), or INVALID_ARGUMENT naming the path and what it is
// ("is a FIFO, expected a regular file"); NOT_FOUND / PERMISSION_DENIED when it cannot be opened.
absl::StatusOr<int> OpenRegularFile(const std::string& path);

// How much of a file the readers below take whole (nothing Ithaca reads whole comes near it;
// token files and weights are mapped, not read): a file past its bound is refused before it is
// read, so a 2 GiB "config.json" cannot take the daemon's memory.
inline constexpr size_t kMaxReadBytes = size_t{256} << 20;
// Bounds of the small files a job names (the daemon reads them at admission).
inline constexpr size_t kMaxJsonConfigBytes = size_t{16} << 20;  // config.json, state.json
inline constexpr size_t kMaxIndexBytes = size_t{64} << 20;       // *.safetensors.index.json
inline constexpr size_t kMaxTokenizerBytes = size_t{128} << 20;  // tokenizer.json

// The whole file (a regular file; see OpenRegularFile). INVALID_ARGUMENT naming the path, its
// size and the bound when it holds more than `max_bytes`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             size_t max_bytes = kMaxReadBytes);

// Streams a file to `path + ".tmp.<pid>"`; Commit() fsyncs and renames it to `path`. Destroying
// the writer without Commit() removes the temporary file.
class AtomicFileWriter {
 public:
  static absl::StatusOr<AtomicFileWriter> Open(const std::string& path);
  AtomicFileWriter(AtomicFileWriter&& o) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Write(const void* data, size_t n);
  absl::Status Write(const std::string& s) { return Write(s.data(), s.size()); }
  // Writes `n` bytes at byte `offset` of the file, wherever the sequential writes have reached
  // (a gap reads as zeros until written): for content that arrives out of order.
  absl::Status WriteAt(uint64_t offset, const void* data, size_t n);
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, FILE* f)
      : path_(std::move(path)), tmp_(std::move(tmp)), f_(f) {}
  std::string path_, tmp_;
  FILE* f_ = nullptr;
};

absl::Status WriteFileAtomic(const std::string& path, const std::string& contents);

// mkdir -p.
absl::Status MakeDirs(const std::string& path);

// Writes all of `data` to `fd`, retrying short and interrupted writes; gives up silently on an
// error (where it is used there is nowhere left to report one). Only write(2): safe in a signal
// handler and between fork and exec.
void WriteAllToFd(int fd, const char* data, size_t n);
bool PathExists(const std::string& path);

}  // namespace ithaca
