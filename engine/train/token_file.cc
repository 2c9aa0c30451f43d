// Token files (write, mmap + validate), the byte-level tokenizer and the sequential DataLoader.
#include "engine/train/token_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "engine/core/file_util.h"

namespace ithaca {

// The token array is used in place from the mapping, so the file's little-endian layout must be
// the host's.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files assume a little-endian host");

namespace {

constexpr int64_t kHeaderBytes = kTokenFileHeaderBytes;

// Index of the first token >= limit, or -1.
int64_t FirstTokenAtLeast(const uint32_t* tokens, int64_t n, uint64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] >= limit) return i;
  }
  return -1;
}

}  // namespace

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
  char header[kHeaderBytes] = {};
  uint64_t count = tokens.size();
  std::memcpy(header, kTokenFileMagic, 8);
  std::memcpy(header + 8, &kTokenFileVersion, 4);
  std::memcpy(header + 12, &vocab_size, 4);
  std::memcpy(header + 16, &count, 8);
  ASSIGN_OR_RETURN(AtomicFileWriter w, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(w.Write(header, sizeof(header)));
  RETURN_IF_ERROR(w.Write(tokens.data(), tokens.size() * sizeof(uint32_t)));
  return w.Commit();
}

TokenFile::~TokenFile() {
  if (map_) munmap(map_, map_bytes_);
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Open(const std::string& path) {
  auto bad = [&path](const std::string& msg) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg));
  };
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat(path, ": cannot open token file: ", std::strerror(err)));
  }
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
  if (bytes < kHeaderBytes) {
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
  f->map_ = map;  // owned from here on, so every error below unmaps
  f->map_bytes_ = bytes;
  f->path_ = path;
  const char* base = static_cast<const char*>(map);

  if (std::memcmp(base, kTokenFileMagic, 8) != 0) {
    return bad("bad magic: not an Ithaca token file (expected \"ITHACATK\")");
  }
  uint32_t version, vocab;
  uint64_t count;
  std::memcpy(&version, base + 8, 4);
  std::memcpy(&vocab, base + 12, 4);
  std::memcpy(&count, base + 16, 8);
  if (version != kTokenFileVersion) {
    return bad(absl::StrCat("unsupported token file version ", version, " (this build reads ",
                            kTokenFileVersion, ")"));
  }
  const uint64_t payload = bytes - kHeaderBytes;
  if (payload % 4 != 0 || payload / 4 != count) {
    std::string want = count <= (std::numeric_limits<uint64_t>::max() - kHeaderBytes) / 4
                           ? absl::StrCat(kHeaderBytes + 4 * count, " bytes")
                           : std::string("an impossible size");
    return bad(absl::StrCat("file is ", bytes, " bytes but its header says ", count,
                            " tokens, which need ", want, " (truncated or corrupt)"));
  }
  f->count_ = static_cast<int64_t>(count);
  f->vocab_size_ = vocab;
  f->tokens_ = reinterpret_cast<const uint32_t*>(base + kHeaderBytes);
  if (vocab > 0) {
    int64_t i = FirstTokenAtLeast(f->tokens_, f->count_, vocab);
    if (i >= 0) {
      return bad(absl::StrCat("token ", i, " (byte offset ", kHeaderBytes + 4 * i, ") is ",
                              f->tokens_[i], ", >= the file's vocab_size ", vocab));
    }
  }
  return f;
}

std::vector<uint32_t> ByteTokenize(const std::string& text) {
  std::vector<uint32_t> out;
  out.reserve(text.size() + text.size() / 64 + 1);
  bool in_doc = false;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;  // the line with its newline
    bool blank = text.find_first_not_of(" \t\r\n", start) >= end;
    if (blank) {
      in_doc = false;  // blank lines separate documents and belong to neither
    } else {
      if (!in_doc) out.push_back(kByteBos);
      in_doc = true;
      for (size_t i = start; i < end; ++i) out.push_back(static_cast<unsigned char>(text[i]));
    }
    start = end;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(std::unique_ptr<TokenFile> file,
                                                               int64_t seq_len,
                                                               int64_t model_vocab) {
  if (!file) return absl::InvalidArgumentError("DataLoader: no token file");
  const std::string& path = file->path();
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": seq_len must be >= 1, got ", seq_len));
  }
  // Samples are int32 token ids, so the vocabulary must fit.
  if (model_vocab < 1 || model_vocab - 1 > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": model vocab_size must be in [1, 2^31], got ", model_vocab));
  }
  if (file->size() < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", file->size(),
        " tokens, too short for one sample of seq_len + 1 = ", seq_len + 1, " tokens"));
  }
  if (file->vocab_size() > model_vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the file's vocab_size ", file->vocab_size(),
                     " exceeds the model's vocab_size ", model_vocab));
  }
  // Open already checked tokens < the file's vocab_size; scan only when that bound is unknown.
  if (file->vocab_size() == 0) {
    int64_t i = FirstTokenAtLeast(file->tokens(), file->size(), model_vocab);
    if (i >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ", i, " is ", file->tokens()[i],
                                                     ", >= the model's vocab_size ", model_vocab));
    }
  }
  auto loader = std::make_unique<DataLoader>();
  loader->samples_per_epoch_ = (file->size() - 1) / seq_len;
  loader->seq_len_ = seq_len;
  loader->file_ = std::move(file);
  return loader;
}

void DataLoader::Next(int32_t* inputs, int32_t* labels) {
  int64_t window = position_ % samples_per_epoch_;
  if (window < 0) window += samples_per_epoch_;
  // Windows step by seq_len, so a window's last label is the next window's first input.
  const uint32_t* t = file_->tokens() + window * seq_len_;
  for (int64_t i = 0; i < seq_len_; ++i) {
    inputs[i] = static_cast<int32_t>(t[i]);
    labels[i] = static_cast<int32_t>(t[i + 1]);
  }
  ++position_;
}

}  // namespace ithaca
