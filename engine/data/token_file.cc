// Token files: write, mmap and validate.
#include "engine/data/token_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "engine/core/file_util.h"

namespace ithaca {

// The token array is used in place from the mapping, so the file's little-endian layout must be
// the host's.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files assume a little-endian host");

namespace {

// The entries of an n-entry array that opening a file checks: every one, or (check_limit >= 0)
// the first and the last check_limit / 2 (as [begin, end) ranges).
std::vector<std::pair<int64_t, int64_t>> CheckedRanges(int64_t n, int64_t check_limit) {
  if (check_limit < 0 || n <= check_limit) return {{0, n}};
  return {{0, check_limit / 2}, {n - check_limit / 2, n}};
}

}  // namespace

// Index of the first token >= limit among those checked, or -1.
int64_t FirstTokenAtLeast(const uint32_t* tokens, int64_t n, uint64_t limit, int64_t check_limit) {
  for (auto [begin, end] : CheckedRanges(n, check_limit)) {
    for (int64_t i = begin; i < end; ++i) {
      if (tokens[i] >= limit) return i;
    }
  }
  return -1;
}

std::string FingerprintHex(const TokenizerFingerprint& f) {
  if (f == TokenizerFingerprint{}) return "byte-level";
  std::string out;
  for (uint8_t b : f) absl::StrAppendFormat(&out, "%02x", b);
  return out;
}

absl::Status WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                            uint32_t vocab_size) {
  // Refuse to write a file that Open would reject.
  if (vocab_size > 0) {
    int64_t bad = FirstTokenAtLeast(tokens.data(), static_cast<int64_t>(tokens.size()), vocab_size);
    if (bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": token ", bad, " is ", tokens[bad], ", >= vocab_size ", vocab_size));
    }
  }
  char header[kTokenFileHeaderBytes] = {};
  const uint32_t version = 1;
  uint64_t count = tokens.size();
  std::memcpy(header, kTokenFileMagic, 8);
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &vocab_size, 4);
  std::memcpy(header + 16, &count, 8);
  ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(w.Write(header, sizeof(header)));
  RETURN_IF_ERROR(w.Write(tokens.data(), tokens.size() * sizeof(uint32_t)));
  return w.Commit();
}

absl::Status WriteTokenFileV2(const std::string& path, const std::vector<uint32_t>& tokens,
                              const TokenFileMeta& meta) {
  auto bad = [&path](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
  };
  const uint64_t n = tokens.size();
  if (meta.vocab_size > 0) {
    int64_t i = FirstTokenAtLeast(tokens.data(), n, meta.vocab_size);
    if (i >= 0) {
      return bad(absl::StrCat("token ", i, " is ", tokens[i], ", >= vocab_size ", meta.vocab_size));
    }
  }
  for (size_t d = 0; d < meta.doc_starts.size(); ++d) {
    if (meta.doc_starts[d] >= n || (d > 0 && meta.doc_starts[d] <= meta.doc_starts[d - 1])) {
      return bad(absl::StrCat("document index entry ", d, " (", meta.doc_starts[d],
                              ") is out of order or past the ", n, " tokens"));
    }
  }
  if (!meta.loss_mask.empty() && meta.loss_mask.size() != n) {
    return bad(
        absl::StrCat("loss mask has ", meta.loss_mask.size(), " entries for ", n, " tokens"));
  }
  char header[kTokenFileV2HeaderBytes] = {};
  const uint64_t docs = meta.doc_starts.size();
  const uint32_t flags = meta.loss_mask.empty() ? 0 : kTokenFileFlagLossMask;
  std::memcpy(header, kTokenFileMagic, 8);
  std::memcpy(header + 8, &kTokenFileVersion, 4);
  std::memcpy(header + 12, &meta.vocab_size, 4);
  std::memcpy(header + 16, &n, 8);
  std::memcpy(header + 24, &docs, 8);
  std::memcpy(header + 32, &flags, 4);
  std::memcpy(header + 36, &meta.bos_id, 4);
  std::memcpy(header + 40, &meta.eos_id, 4);
  std::memcpy(header + 48, meta.fingerprint.data(), 32);
  ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(w.Write(header, sizeof(header)));
  RETURN_IF_ERROR(w.Write(tokens.data(), n * sizeof(uint32_t)));
  const char pad[4] = {};
  if (n % 2) RETURN_IF_ERROR(w.Write(pad, 4));
  RETURN_IF_ERROR(w.Write(meta.doc_starts.data(), docs * sizeof(uint64_t)));
  RETURN_IF_ERROR(w.Write(meta.loss_mask.data(), meta.loss_mask.size()));
  return w.Commit();
}

TokenFile::~TokenFile() {
  if (map_) munmap(map_, map_bytes_);
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path,
                                                           int64_t check_limit) {
  auto bad = [&path](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
  };
  // Never blocks on a FIFO or a device: those are errors naming the path.
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return bad("not a regular file");
  }
  const int64_t bytes = st.st_size;
  if (bytes == 0) {
    close(fd);
    return bad("empty file (a token file starts with a 32-byte header)");
  }
  if (bytes < kTokenFileHeaderBytes) {
    close(fd);
    return bad(absl::StrCat("file is ", bytes, " bytes, shorter than the 32-byte header"));
  }
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return absl::Status(absl::ErrnoToStatusCode(map_errno),
                        absl::StrCat(path, ": mmap failed: ", std::strerror(map_errno)));
  }
  std::unique_ptr<TokenFile> f(new TokenFile());
  f->check_limit_ = check_limit;
  f->map_ = map;  // owned from here on, so every error below unmaps
  f->map_bytes_ = bytes;
  f->path_ = path;
  const char* base = static_cast<const char*>(map);

  if (std::memcmp(base, kTokenFileMagic, 8) != 0) {
    return bad("bad magic: not an Ithaca token file (expected \"ITHACATK\")");
  }
  std::memcpy(&f->version_, base + 8, 4);
  if (f->version_ == 1) {
    RETURN_IF_ERROR(f->ParseV1(bytes));
  } else if (f->version_ == 2) {
    RETURN_IF_ERROR(f->ParseV2(bytes));
  } else {
    return bad(absl::StrCat("unsupported token file version ", f->version_,
                            " (this build reads 1 and 2)"));
  }
  if (f->vocab_size_ > 0) {
    const int64_t header = f->version_ == 1 ? kTokenFileHeaderBytes : kTokenFileV2HeaderBytes;
    int64_t i = FirstTokenAtLeast(f->tokens_, f->count_, f->vocab_size_, check_limit);
    if (i >= 0) {
      return bad(absl::StrCat("token ", i, " (byte offset ", header + 4 * i, ") is ", f->tokens_[i],
                              ", >= the file's vocab_size ", f->vocab_size_));
    }
  }
  return f;
}

absl::Status TokenFile::ParseV1(int64_t bytes) {
  const char* base = static_cast<const char*>(map_);
  uint64_t count;
  std::memcpy(&vocab_size_, base + 12, 4);
  std::memcpy(&count, base + 16, 8);
  const uint64_t payload = bytes - kTokenFileHeaderBytes;
  if (payload % 4 != 0 || payload / 4 != count) {
    std::string want = count <= (std::numeric_limits<uint64_t>::max() - kTokenFileHeaderBytes) / 4
                           ? absl::StrCat(kTokenFileHeaderBytes + 4 * count, " bytes")
                           : std::string("an impossible size");
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": file is ", bytes, " bytes but its header says ", count,
                     " tokens, which need ", want, " (truncated or corrupt)"));
  }
  count_ = static_cast<int64_t>(count);
  tokens_ = reinterpret_cast<const uint32_t*>(base + kTokenFileHeaderBytes);
  return absl::OkStatus();
}

absl::Status TokenFile::ParseV2(int64_t bytes) {
  auto bad = [this](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", msg));
  };
  if (bytes < kTokenFileV2HeaderBytes) {
    return bad(absl::StrCat("file is ", bytes,
                            " bytes, shorter than the 128-byte version 2 header (truncated)"));
  }
  const char* base = static_cast<const char*>(map_);
  uint64_t count, docs;
  uint32_t flags;
  std::memcpy(&vocab_size_, base + 12, 4);
  std::memcpy(&count, base + 16, 8);
  std::memcpy(&docs, base + 24, 8);
  std::memcpy(&flags, base + 32, 4);
  std::memcpy(&bos_id_, base + 36, 4);
  std::memcpy(&eos_id_, base + 40, 4);
  std::memcpy(fingerprint_.data(), base + 48, 32);
  if (flags & ~kTokenFileFlagLossMask) {
    return bad(absl::StrCat("unknown flags 0x", absl::Hex(flags), " (corrupt, or a newer format)"));
  }
  for (int64_t i : {44, 45, 46, 47}) {
    if (base[i] != 0)
      return bad(absl::StrCat("reserved header byte ", i, " is not zero (corrupt)"));
  }
  for (int64_t i = 80; i < kTokenFileV2HeaderBytes; ++i) {
    if (base[i] != 0)
      return bad(absl::StrCat("reserved header byte ", i, " is not zero (corrupt)"));
  }
  // Sizes in 128-bit arithmetic would be exact; bounding the counts by the file size first keeps
  // 64 bits enough.
  const uint64_t payload = bytes - kTokenFileV2HeaderBytes;
  const bool has_mask = flags & kTokenFileFlagLossMask;
  uint64_t want = 0;
  bool possible = count <= payload && docs <= payload;
  if (possible) {
    want = kTokenFileV2HeaderBytes + 4 * count + (count % 2 ? 4 : 0) + 8 * docs +
           (has_mask ? count : 0);
  }
  if (!possible || want != static_cast<uint64_t>(bytes)) {
    return bad(absl::StrCat("file is ", bytes, " bytes but its header says ", count, " tokens, ",
                            docs, " documents", has_mask ? " and a loss mask" : "", ", which need ",
                            possible ? absl::StrCat(want, " bytes") : "an impossible size",
                            " (truncated or corrupt)"));
  }
  count_ = static_cast<int64_t>(count);
  num_docs_ = static_cast<int64_t>(docs);
  tokens_ = reinterpret_cast<const uint32_t*>(base + kTokenFileV2HeaderBytes);
  const int64_t index_at = kTokenFileV2HeaderBytes + 4 * count + (count % 2 ? 4 : 0);
  doc_starts_ = reinterpret_cast<const uint64_t*>(base + index_at);
  for (auto [begin, end] : CheckedRanges(num_docs_, check_limit_)) {
    for (int64_t d = begin; d < end; ++d) {
      if (doc_starts_[d] >= count || (d > 0 && doc_starts_[d] <= doc_starts_[d - 1])) {
        return bad(absl::StrCat("document index entry ", d, " is ", doc_starts_[d],
                                d > 0 ? absl::StrCat(" after ", doc_starts_[d - 1]) : "",
                                ": not strictly increasing below ", count, " tokens (corrupt)"));
      }
    }
  }
  if (has_mask) {
    loss_mask_ = reinterpret_cast<const uint8_t*>(base + index_at + 8 * docs);
    for (auto [begin, end] : CheckedRanges(count_, check_limit_)) {
      for (int64_t i = begin; i < end; ++i) {
        if (loss_mask_[i] > 1) {
          return bad(absl::StrCat("loss mask entry ", i, " is ", int(loss_mask_[i]),
                                  ", not 0 or 1 (corrupt)"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace ithaca
