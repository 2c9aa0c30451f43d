// Token files (write, mmap + validate), the byte-level tokenizer and the DataLoader.
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
#include "engine/core/path_policy.h"

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

// Index of the first token >= limit among those checked, or -1.
int64_t FirstTokenAtLeast(const uint32_t* tokens, int64_t n, uint64_t limit,
                          int64_t check_limit = TokenFile::kCheckEvery) {
  for (auto [begin, end] : CheckedRanges(n, check_limit)) {
    for (int64_t i = begin; i < end; ++i) {
      if (tokens[i] >= limit) return i;
    }
  }
  return -1;
}

// ---- SHA-256 (FIPS 180-4), so fingerprints need no crypto library.
constexpr uint32_t kSha256K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Sha256Block(uint32_t h[8], const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 |
           p[4 * i + 3];
  }
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 =
        k + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + kSha256K[i] + w[i];
    uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

// ---- The shuffled window order: a keyed bijection on [0, n) (a Feistel network on the next
// even power of two, cycle-walking back into range), so any position maps to its window in O(1)
// without storing a permutation.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int64_t Permute(int64_t index, int64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 2;
  while ((int64_t{1} << bits) < n) bits += 2;
  const int half = bits / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  uint64_t x = static_cast<uint64_t>(index);
  do {
    uint64_t l = x >> half, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      uint64_t f = SplitMix64(key ^ SplitMix64(r ^ (round << 56))) & mask;
      uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    x = (l << half) | r;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

}  // namespace

TokenizerFingerprint Sha256(const void* data, size_t n) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_t full = n / 64 * 64;
  for (size_t i = 0; i < full; i += 64) Sha256Block(h, p + i);
  uint8_t tail[128] = {};
  size_t rest = n - full;
  std::memcpy(tail, p + full, rest);
  tail[rest] = 0x80;
  size_t tail_bytes = rest + 9 <= 64 ? 64 : 128;
  uint64_t bits = uint64_t(n) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_bytes - 1 - i] = uint8_t(bits >> (8 * i));
  for (size_t i = 0; i < tail_bytes; i += 64) Sha256Block(h, tail + i);
  TokenizerFingerprint out;
  for (int i = 0; i < 32; ++i) out[i] = uint8_t(h[i / 4] >> (24 - 8 * (i % 4)));
  return out;
}

absl::StatusOr<TokenizerFingerprint> Sha256File(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path, kMaxTokenizerBytes));
  return Sha256(bytes.data(), bytes.size());
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

TokenFileMeta ByteTokenMeta(const std::vector<uint32_t>& tokens) {
  TokenFileMeta m;
  m.vocab_size = kByteVocab;
  m.bos_id = kByteBos;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] == kByteBos) m.doc_starts.push_back(i);
  }
  return m;
}

absl::StatusOr<std::vector<std::string>> ExpandDataPath(const std::string& pattern) {
  // The worker expands the pattern again, under the same bounds and the same roots as admission
  // (ithacad passes them in $ITHACA_ALLOWED_ROOTS): a link planted since is refused.
  ASSIGN_OR_RETURN(std::vector<std::string> roots, AllowedRootsFromEnvironment());
  return ExpandPattern(pattern, roots);
}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(std::unique_ptr<TokenFile> file,
                                                               int64_t seq_len, int64_t model_vocab,
                                                               const DataOptions& options) {
  std::vector<std::unique_ptr<TokenFile>> files;
  files.push_back(std::move(file));
  return Create(std::move(files), seq_len, model_vocab, options);
}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(
    std::vector<std::unique_ptr<TokenFile>> files, int64_t seq_len, int64_t model_vocab,
    const DataOptions& options) {
  if (files.empty()) return absl::InvalidArgumentError("DataLoader: no token file");
  for (const auto& f : files) {
    if (!f) return absl::InvalidArgumentError("DataLoader: a null token file");
  }
  const std::string& path = files[0]->path();
  const std::string names =
      files.size() == 1 ? path : absl::StrCat(path, " and ", files.size() - 1, " more files");
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": seq_len must be >= 1, got ", seq_len));
  }
  // Samples are int32 token ids, so the vocabulary must fit.
  if (model_vocab < 1 || model_vocab - 1 > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": model vocab_size must be in [1, 2^31], got ", model_vocab));
  }
  auto loader = std::unique_ptr<DataLoader>(new DataLoader());
  // Every file must come from one tokenizer, and from the model's when the model names one.
  const TokenFile& first = *files[0];
  for (const auto& f : files) {
    if (f->fingerprint() != first.fingerprint() || f->vocab_size() != first.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          f->path(), ": made with tokenizer ", FingerprintHex(f->fingerprint()), " (vocab_size ",
          f->vocab_size(), ") but ", first.path(), " with ", FingerprintHex(first.fingerprint()),
          " (vocab_size ", first.vocab_size(), "): the files of one data set must share one"));
    }
  }
  if (!options.tokenizer_json.empty()) {
    ASSIGN_OR_RETURN(TokenizerFingerprint model_fp, Sha256File(options.tokenizer_json));
    if (first.has_fingerprint() && first.fingerprint() != model_fp) {
      return absl::InvalidArgumentError(absl::StrCat(
          first.path(), ": tokenized with tokenizer sha256 ", FingerprintHex(first.fingerprint()),
          ", but the model's tokenizer ", options.tokenizer_json, " has sha256 ",
          FingerprintHex(model_fp), ": re-tokenize with --tokenizer ", options.tokenizer_json));
    }
    if (!first.has_fingerprint()) {
      const std::string what =
          absl::StrCat(first.path(),
                       first.version() == 1 ? ": a version 1 file, which records no tokenizer"
                                            : ": byte-level tokens",
                       ", but the model has its own tokenizer ", options.tokenizer_json);
      const std::string dir = options.tokenizer_json.substr(0, options.tokenizer_json.rfind('/'));
      if (!options.allow_byte_tokens) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": tokenize with `ithaca-tokenize --tokenizer ", dir,
                         "`, or set data.byte_tokens = true to train on bytes all the same"));
      }
      loader->warnings_.push_back(
          absl::StrCat(what,
                       " (data.byte_tokens = true); its own tokens: ithaca-tokenize "
                       "--tokenizer ",
                       dir));
    }
  } else if (first.has_fingerprint()) {
    loader->warnings_.push_back(absl::StrCat(
        first.path(), ": tokenized with tokenizer sha256 ", FingerprintHex(first.fingerprint()),
        "; the model directory has no tokenizer.json to check it against"));
  }
  for (const auto& f : files) {
    if (f->vocab_size() > model_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(f->path(), ": the file's vocab_size ", f->vocab_size(),
                       " exceeds the model's vocab_size ", model_vocab));
    }
    // Open already checked tokens < the file's vocab_size; scan only when that bound is unknown.
    if (f->vocab_size() == 0) {
      int64_t i = FirstTokenAtLeast(f->tokens(), f->size(), model_vocab, f->check_limit());
      if (i >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(f->path(), ": token ", i, " is ", f->tokens()[i],
                         ", >= the model's vocab_size ", model_vocab));
      }
    }
  }
  // A byte-level corpus can train any model, but a large vocabulary then mostly goes unused.
  if (!first.has_fingerprint() && first.vocab_size() > 0 && first.vocab_size() <= kByteVocab &&
      model_vocab >= 16 * int64_t{kByteVocab}) {
    loader->warnings_.push_back(absl::StrCat(names, ": byte-level tokens (vocab_size ",
                                             first.vocab_size(), ") for a model with ", model_vocab,
                                             " tokens: most of its vocabulary will never be seen"));
  }
  for (const auto& f : files) {
    if (options.loss_mask && f->loss_mask() == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(f->path(),
                       ": data.loss_mask is set but the file has no loss mask (make it "
                       "with ithaca-tokenize --sft)"));
    }
    if (options.document_mask && !f->has_doc_index() && options.bos_id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(f->path(),
                       ": data.document_mask is set but this version 1 file has no "
                       "document index and the model has no bos_token_id to find "
                       "documents by; re-tokenize it (ithaca-tokenize writes version 2)"));
    }
  }
  int64_t total = 0;
  for (const auto& f : files) {
    loader->first_window_.push_back(total);
    total += f->size() > 0 ? (f->size() - 1) / seq_len : 0;
  }
  loader->first_window_.push_back(total);
  if (total == 0) {
    return absl::InvalidArgumentError(
        files.size() == 1
            ? absl::StrCat(path, ": ", first.size(),
                           " tokens, too short for one sample of seq_len + 1 = ", seq_len + 1,
                           " tokens")
            : absl::StrCat(names, ": no file holds one sample of seq_len + 1 = ", seq_len + 1,
                           " tokens"));
  }
  loader->samples_per_epoch_ = total;
  loader->seq_len_ = seq_len;
  loader->shuffle_ = options.shuffle;
  loader->options_ = options;
  loader->seed_ = options.seed;
  loader->files_ = std::move(files);
  return loader;
}

absl::StatusOr<std::unique_ptr<DataLoader>> DataLoader::CreateMix(
    std::vector<std::vector<std::unique_ptr<TokenFile>>> sources, const std::vector<int64_t>& slots,
    int64_t seq_len, int64_t model_vocab, const DataOptions& options) {
  if (sources.empty() || sources.size() != slots.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.weights: ", slots.size(), " weights for ", sources.size(), " sources"));
  }
  int64_t period = 0;
  for (int64_t n : slots) {
    if (n < 1) return absl::InvalidArgumentError("data.weights: a source has no slot");
    period += n;
  }
  auto loader = std::unique_ptr<DataLoader>(new DataLoader());
  for (size_t i = 0; i < sources.size(); ++i) {
    DataOptions o = options;
    o.seed = SplitMix64(options.seed ^ SplitMix64(0x6d6978ULL + i));  // "mix" + i
    ASSIGN_OR_RETURN(std::unique_ptr<DataLoader> source,
                     Create(std::move(sources[i]), seq_len, model_vocab, o));
    const TokenFile& a = loader->mix_.empty() ? source->file(0) : loader->mix_[0]->file(0);
    const TokenFile& b = source->file(0);
    if (a.fingerprint() != b.fingerprint() || a.vocab_size() != b.vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(b.path(), " (data.path's source ", i + 1, "): made with tokenizer ",
                       FingerprintHex(b.fingerprint()), " (vocab_size ", b.vocab_size(), ") but ",
                       a.path(), " with ", FingerprintHex(a.fingerprint()), " (vocab_size ",
                       a.vocab_size(), "): the sources of a mix must share one tokenizer"));
    }
    for (const std::string& w : source->warnings()) {
      if (std::find(loader->warnings_.begin(), loader->warnings_.end(), w) ==
          loader->warnings_.end()) {
        loader->warnings_.push_back(w);
      }
    }
    loader->first_file_.push_back(loader->all_files_.size());
    for (size_t f = 0; f < source->files_.size(); ++f) {
      loader->all_files_.push_back(source->files_[f].get());
    }
    loader->samples_per_epoch_ += source->samples_per_epoch();
    loader->mix_.push_back(std::move(source));
  }
  // Smooth weighted round robin over one period: every slot, each source's credit grows by its
  // share and the one with the most credit (the lowest index among equals) takes the slot and
  // pays the period; over the period source i takes exactly slots[i] slots.
  std::vector<int64_t> credit(slots.size(), 0), taken(slots.size(), 0);
  for (int64_t slot = 0; slot < period; ++slot) {
    size_t best = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      credit[i] += slots[i];
      if (credit[i] > credit[best]) best = i;
    }
    credit[best] -= period;
    loader->slot_source_.push_back(static_cast<uint32_t>(best));
    loader->slot_rank_.push_back(static_cast<uint32_t>(taken[best]++));
  }
  loader->mix_slots_ = slots;
  loader->seq_len_ = seq_len;
  loader->options_ = options;
  loader->seed_ = options.seed;
  return loader;
}

std::pair<size_t, int64_t> DataLoader::SourceFor(int64_t position) const {
  if (mix_.empty()) return {0, position};
  const int64_t period = static_cast<int64_t>(slot_source_.size());
  const int64_t cycle = position / period, slot = position % period;
  const size_t source = slot_source_[slot];
  return {source, cycle * mix_slots_[source] + slot_rank_[slot]};
}

int64_t DataLoader::WindowFor(int64_t position) const {
  const int64_t n = samples_per_epoch_;
  int64_t epoch = position / n, index = position % n;
  if (index < 0) index += n, --epoch;
  if (!shuffle_) return index;
  return Permute(index, n, SplitMix64(seed_ ^ SplitMix64(static_cast<uint64_t>(epoch))));
}

void DataLoader::Read(int64_t position, int32_t* inputs, int32_t* labels,
                      std::vector<int64_t>* doc_starts, size_t* file, int64_t* offset) const {
  if (!mix_.empty()) {
    const auto [source, index] = SourceFor(position);
    mix_[source]->Read(index, inputs, labels, doc_starts, file, offset);
    *file += first_file_[source];
    return;
  }
  const int64_t window = WindowFor(position);
  // The file holding the window: the last whose first window is <= it.
  *file = std::upper_bound(first_window_.begin(), first_window_.end() - 1, window) -
          first_window_.begin() - 1;
  const TokenFile& f = *files_[*file];
  // Windows step by seq_len, so a window's last label is the next window's first input.
  *offset = (window - first_window_[*file]) * seq_len_;
  const uint32_t* t = f.tokens() + *offset;
  for (int64_t i = 0; i < seq_len_; ++i) {
    inputs[i] = static_cast<int32_t>(t[i]);
    labels[i] = static_cast<int32_t>(t[i + 1]);
  }
  doc_starts->clear();
  // Whether the token after the window (the last label) starts a document.
  bool next_starts = false;
  if (f.has_doc_index()) {
    const uint64_t* docs = f.doc_starts();
    const uint64_t lo = *offset, hi = *offset + seq_len_;
    const uint64_t* d = std::lower_bound(docs, docs + f.num_docs(), lo);
    for (; d != docs + f.num_docs() && *d < hi; ++d) {
      doc_starts->push_back(static_cast<int64_t>(*d - lo));
    }
    next_starts = d != docs + f.num_docs() && *d == hi;
  } else if (options_.document_mask) {
    const uint32_t bos = static_cast<uint32_t>(options_.bos_id);
    for (int64_t i = 0; i < seq_len_; ++i) {
      if (t[i] == bos) doc_starts->push_back(i);
    }
    next_starts = t[seq_len_] == bos;
  }
  if (options_.document_mask) {
    // Each document is trained as if alone: nothing predicts the next document's first token.
    for (size_t k = 0; k < doc_starts->size(); ++k) {
      if ((*doc_starts)[k] > 0) labels[(*doc_starts)[k] - 1] = -1;
    }
    if (next_starts) labels[seq_len_ - 1] = -1;
  }
  if (options_.loss_mask) {
    const uint8_t* mask = f.loss_mask() + *offset + 1;  // the labels' tokens
    for (int64_t i = 0; i < seq_len_; ++i) {
      if (mask[i] == 0) labels[i] = -1;
    }
  }
}

void DataLoader::Next(int32_t* inputs, int32_t* labels) {
  Read(position_, inputs, labels, &sample_doc_starts_, &sample_file_, &sample_offset_);
  ++position_;
}

int64_t DataLoader::CountLabels(int64_t position) const {
  if (!options_.document_mask && !options_.loss_mask) return seq_len_;
  std::vector<int32_t> inputs(seq_len_), labels(seq_len_);
  std::vector<int64_t> docs;
  size_t file = 0;
  int64_t offset = 0;
  Read(position, inputs.data(), labels.data(), &docs, &file, &offset);
  return std::count_if(labels.begin(), labels.end(), [](int32_t v) { return v >= 0; });
}

}  // namespace ithaca
