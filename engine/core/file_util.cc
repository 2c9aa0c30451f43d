#include "engine/core/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

namespace ithaca {

namespace {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<int> OpenRegularFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string type = FileTypeName(st.st_mode);
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is ", type, ", expected a regular file"));
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, size_t max_bytes) {
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct stat st;
  if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) > max_bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.st_size, " bytes, more than the ",
                                                   max_bytes, " such a file may have"));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::DataLossError(absl::StrCat(path, ": read error: ", std::strerror(err)));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > max_bytes) {  // grew while read
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": more than the ", max_bytes, " bytes such a file may have"));
    }
  }
  close(fd);
  return out;
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot create ", tmp, ": ", std::strerror(errno)));
  }
  return AtomicFileWriter(path, tmp, f);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& o) noexcept
    : path_(std::move(o.path_)), tmp_(std::move(o.tmp_)), f_(o.f_) {
  o.f_ = nullptr;
  o.tmp_.clear();
}

AtomicFileWriter::~AtomicFileWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

namespace {

// A failed write is an I/O error (UNAVAILABLE: it may succeed once space is freed), never "out
// of memory": a full disk says so.
absl::Status WriteError(const std::string& what, int err) {
  return absl::UnavailableError(
      absl::StrCat(what, ": ", std::strerror(err),
                   err == ENOSPC || err == EDQUOT ? " (the disk or quota is full)" : ""));
}

}  // namespace

absl::Status AtomicFileWriter::Write(const void* data, size_t n) {
  if (!f_) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (n && std::fwrite(data, 1, n, f_) != n) return WriteError(path_ + ": write failed", errno);
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::WriteAt(uint64_t offset, const void* data, size_t n) {
  if (!f_) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (std::fflush(f_) != 0) {  // the buffered sequential writes land first
    return WriteError(path_ + ": write failed", errno);
  }
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = pwrite(fileno(f_), p, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return WriteError(absl::StrCat(path_, ": write of ", n, " bytes at ", offset, " failed"),
                        w < 0 ? errno : ENOSPC);
    }
    p += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (!f_) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  bool ok = std::fflush(f_) == 0 && fsync(fileno(f_)) == 0;
  ok = (std::fclose(f_) == 0) && ok;
  f_ = nullptr;
  if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_.c_str());
    return WriteError(path_ + ": could not commit", err);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomic(const std::string& path, const std::string& contents) {
  ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(w.Write(contents));
  return w.Commit();
}

absl::Status MakeDirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
        return absl::PermissionDeniedError(
            absl::StrCat("cannot create directory ", cur, ": ", std::strerror(errno)));
      }
    }
    if (i < path.size()) cur += path[i];
  }
  return absl::OkStatus();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

void WriteAllToFd(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace ithaca
