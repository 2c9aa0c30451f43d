// Token files: pre-tokenized training data (the format; data_loader.h serves windows of them).
//
// Version 2 (written by ithaca-tokenize, tools/tokenize/ithaca_tokenize.py, and by
// WriteTokenFileV2). Little-endian:
//   offset 0    8 bytes   magic "ITHACATK"
//   offset 8    uint32    version (2)
//   offset 12   uint32    vocab_size: the tokenizer's vocabulary (ids are < it); 0 if unknown
//   offset 16   uint64    N: number of tokens
//   offset 24   uint64    D: number of entries in the document index
//   offset 32   uint32    flags: bit 0 = a loss-mask section follows the document index;
//                         other bits must be 0
//   offset 36   int32     bos_id (-1: the tokenizer adds no BOS)
//   offset 40   int32     eos_id (-1: the tokenizer adds no EOS)
//   offset 44   4 bytes   reserved (zero)
//   offset 48   32 bytes  tokenizer fingerprint: SHA-256 of the tokenizer.json the tokens came
//                         from; all zero for the built-in byte-level tokenizer (ByteTokenize)
//   offset 80   48 bytes  reserved (zero)
//   offset 128  N × uint32       tokens
//               0 or 4 bytes     zero padding, so the index starts at a multiple of 8
//               D × uint64       document index: the token offset of each document's first
//                                token, strictly increasing, each < N. A shard may begin in the
//                                middle of a document (one split over shards): its first entry
//                                is then > 0.
//               N × uint8        loss mask, only when flags bit 0: mask[i] = 1 when token i
//                                counts as a label (the prediction of token i from the tokens
//                                before it is trained), 0 when it does not (e.g. a prompt)
// The file ends there: any other size is rejected as truncated or corrupt, and so are non-zero
// reserved bytes, unknown flags, an index out of order and tokens ≥ vocab_size.
//
// Version 1 (still read): the 32-byte header magic, version 1, vocab_size, N, 8 reserved bytes,
// then N × uint32 tokens. It has no document index, no BOS/EOS ids and no fingerprint.
//
// Errors name the file: INVALID_ARGUMENT for a malformed file, the errno's code (NOT_FOUND, ...)
// when it cannot be opened.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "engine/data/sha256.h"

namespace ithaca {

inline constexpr char kTokenFileMagic[8] = {'I', 'T', 'H', 'A', 'C', 'A', 'T', 'K'};
inline constexpr uint32_t kTokenFileVersion = 2;         // what WriteTokenFileV2 writes
inline constexpr int64_t kTokenFileHeaderBytes = 32;     // version 1
inline constexpr int64_t kTokenFileV2HeaderBytes = 128;  // version 2
inline constexpr uint32_t kTokenFileFlagLossMask = 1;

// The SHA-256 of the tokenizer.json the tokens came from; all zero: byte-level.
using TokenizerFingerprint = Sha256Digest;
std::string FingerprintHex(const TokenizerFingerprint& f);  // "byte-level" when all zero

// What a version 2 file says besides its tokens.
struct TokenFileMeta {
  uint32_t vocab_size = 0;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  TokenizerFingerprint fingerprint{};
  std::vector<uint64_t> doc_starts;  // the document index
  std::vector<uint8_t> loss_mask;    // empty, or one byte per token
};

// Writes a version 1 file atomically (kept for old tools and tests of the v1 reader).
absl::Status WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                            uint32_t vocab_size);
// Writes a version 2 file atomically; refuses metadata that Open would reject.
absl::Status WriteTokenFileV2(const std::string& path, const std::vector<uint32_t>& tokens,
                              const TokenFileMeta& meta);

// A read-only, memory-mapped token file of either version.
class TokenFile {
 public:
  // Opening checks the file's header and sizes, and its entries (tokens below its vocab_size,
  // a strictly increasing document index, a 0/1 loss mask): every one (kCheckEvery, what the
  // trainer does), or the first and last check_limit / 2 of each (ithacad's admission: a 4 GiB
  // file is not scanned inside a call; the ranks check the rest when they open it).
  static constexpr int64_t kCheckEvery = -1;
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path,
                                                         int64_t check_limit = kCheckEvery);
  int64_t check_limit() const { return check_limit_; }
  ~TokenFile();
  int64_t size() const { return count_; }
  uint32_t version() const { return version_; }
  uint32_t vocab_size() const { return vocab_size_; }
  const uint32_t* tokens() const { return tokens_; }
  const std::string& path() const { return path_; }  // as given to Open, for error messages
  int32_t bos_id() const { return bos_id_; }         // -1 when none (and in version 1)
  int32_t eos_id() const { return eos_id_; }
  // Version 2 only; all zero for byte-level files and in version 1.
  const TokenizerFingerprint& fingerprint() const { return fingerprint_; }
  bool has_fingerprint() const { return fingerprint_ != TokenizerFingerprint{}; }
  bool has_doc_index() const { return version_ >= 2; }
  int64_t num_docs() const { return num_docs_; }
  const uint64_t* doc_starts() const { return doc_starts_; }  // num_docs() entries
  const uint8_t* loss_mask() const { return loss_mask_; }     // size() entries, or nullptr

 private:
  TokenFile() = default;
  absl::Status ParseV1(int64_t bytes);
  absl::Status ParseV2(int64_t bytes);
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint32_t version_ = 0;
  const uint32_t* tokens_ = nullptr;
  int64_t count_ = 0;
  int64_t check_limit_ = kCheckEvery;
  uint32_t vocab_size_ = 0;
  int32_t bos_id_ = -1, eos_id_ = -1;
  TokenizerFingerprint fingerprint_{};
  int64_t num_docs_ = 0;
  const uint64_t* doc_starts_ = nullptr;
  const uint8_t* loss_mask_ = nullptr;
};

// Index of the first token >= limit among the first n of `tokens`, or -1: of every one, or
// (check_limit >= 0) of the first and last check_limit / 2 (what TokenFile::Open checks).
int64_t FirstTokenAtLeast(const uint32_t* tokens, int64_t n, uint64_t limit,
                          int64_t check_limit = TokenFile::kCheckEvery);

}  // namespace ithaca
