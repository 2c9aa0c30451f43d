#include "engine/train/tensorboard.h"

#include <fcntl.h>

#include "engine/core/path_policy.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/core/file_util.h"

namespace ithaca {
namespace {

const std::array<uint32_t, 256>& Crc32cTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol buffer wire format, the few pieces an Event needs.
void Varint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void Key(std::string* out, int field, int wire_type) {
  Varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}
template <typename T>
void Fixed(std::string* out, T v) {  // little-endian, as every supported host is
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}
void Bytes(std::string* out, int field, const std::string& s) {
  Key(out, field, 2);
  Varint(out, s.size());
  out->append(s);
}

double NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

}  // namespace

uint32_t Crc32c(const void* data, size_t n) {
  const auto& t = Crc32cTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(const void* data, size_t n) {
  const uint32_t c = Crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string TensorBoardScalarEvent(double wall_time, int64_t step,
                                   const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    Bytes(&v, 1, tag);
    Key(&v, 2, 5);
    Fixed(&v, static_cast<float>(value));
    Bytes(&summary, 1, v);
  }
  std::string event;
  Key(&event, 1, 1);
  Fixed(&event, wall_time);
  Key(&event, 2, 0);
  Varint(&event, static_cast<uint64_t>(step));
  Bytes(&event, 5, summary);
  return event;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(const std::string& dir) {
  // Inside the allowed roots (ithacad's --allowed-roots, passed down to the workers), made and
  // opened one component at a time without following links: a link at
  // checkpoint.dir/tensorboard cannot send the event file elsewhere (issue 43 N2).
  ASSIGN_OR_RETURN(std::vector<std::string> roots, AllowedRootsFromEnvironment());
  RETURN_IF_ERROR(roots.empty() ? MakeDirs(dir) : MakeDirsInsideRoots(dir, roots));
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  // The pid and a counter keep two writers of one process and second apart.
  static int opened = 0;
  const std::string path =
      absl::StrCat(dir, "/events.out.tfevents.", static_cast<int64_t>(std::time(nullptr)), ".",
                   host, ".", getpid(), opened++ > 0 ? absl::StrCat(".", opened) : "");
  absl::StatusOr<int> fd = OpenInsideRoots(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, roots);
  if (!fd.ok()) {
    return absl::Status(fd.status().code(), absl::StrCat("metrics.tensorboard: cannot create ",
                                                         path, ": ", fd.status().message()));
  }
  std::FILE* f = fdopen(*fd, "wb");
  if (f == nullptr) {
    close(*fd);
    return absl::InternalError(
        absl::StrCat("metrics.tensorboard: cannot create ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<TensorBoardWriter> w(new TensorBoardWriter(f, path));
  std::string first;
  Key(&first, 1, 1);
  Fixed(&first, NowSeconds());
  Bytes(&first, 3, "brain.Event:2");
  RETURN_IF_ERROR(w->Record(first));
  return w;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

absl::Status TensorBoardWriter::Record(const std::string& data) {
  std::string frame;
  Fixed(&frame, static_cast<uint64_t>(data.size()));
  Fixed(&frame, MaskedCrc32c(frame.data(), 8));
  frame.append(data);
  Fixed(&frame, MaskedCrc32c(data.data(), data.size()));
  if (std::fwrite(frame.data(), 1, frame.size(), f_) != frame.size() || std::fflush(f_) != 0) {
    return absl::InternalError(
        absl::StrCat("metrics.tensorboard: writing ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::Write(int64_t step,
                                      const std::vector<std::pair<std::string, double>>& scalars,
                                      double wall_time) {
  return Record(TensorBoardScalarEvent(wall_time > 0 ? wall_time : NowSeconds(), step, scalars));
}

}  // namespace ithaca
