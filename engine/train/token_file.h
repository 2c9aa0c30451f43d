// Token files: pre-tokenized training data.
//
// Layout (little-endian):
//   offset 0   8 bytes  magic "ITHACATK"
//   offset 8   uint32   version (1)
//   offset 12  uint32   vocab_size (upper bound on token ids + 1; 0 if unknown)
//   offset 16  uint64   count: number of tokens
//   offset 24  8 bytes  reserved (zero)
//   offset 32  count × uint32 tokens
// A file whose size is not 32 + 4·count, whose magic or version is wrong, or with a token
// ≥ vocab_size (when vocab_size > 0) is rejected with a message saying which.
// Errors name the file: INVALID_ARGUMENT for a malformed file, the errno's code (NOT_FOUND, ...)
// when it cannot be opened.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

inline constexpr char kTokenFileMagic[8] = {'I', 'T', 'H', 'A', 'C', 'A', 'T', 'K'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderBytes = 32;

// Writes atomically.
absl::Status WriteTokenFile(const std::string& path, const std::vector<uint32_t>& tokens,
                            uint32_t vocab_size);

// A read-only, memory-mapped token file.
class TokenFile {
 public:
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path);
  ~TokenFile();
  int64_t size() const { return count_; }
  uint32_t vocab_size() const { return vocab_size_; }
  const uint32_t* tokens() const { return tokens_; }
  const std::string& path() const { return path_; }  // as given to Open, for error messages

 private:
  TokenFile() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint32_t* tokens_ = nullptr;
  int64_t count_ = 0;
  uint32_t vocab_size_ = 0;
};

// Byte-level tokenizer for the demo and tests: token = byte value (0..255), and kByteBos (256)
// starts every document (documents are separated by blank lines). vocab_size 258.
// A document is a run of non-blank lines (a blank line is empty or only spaces, tabs and '\r');
// its tokens are BOS then every byte of its lines, newlines included. The separating blank lines
// produce no tokens, and no EOS is emitted: the next document's BOS marks the boundary.
inline constexpr uint32_t kByteBos = 256;
inline constexpr uint32_t kByteEos = 257;
inline constexpr uint32_t kByteVocab = 258;
std::vector<uint32_t> ByteTokenize(const std::string& text);

// Serves samples of seq_len + 1 consecutive tokens: inputs = first seq_len, labels = the same
// window shifted by one (labels are shifted before any sequence sharding). Samples are taken in
// order, non-overlapping, wrapping around; `position` (samples served so far) is saved in
// checkpoints so a resumed run sees the same data.
class DataLoader {
 public:
  // INVALID_ARGUMENT if the file has fewer than seq_len + 1 tokens or tokens ≥ model_vocab.
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(std::unique_ptr<TokenFile> file,
                                                            int64_t seq_len, int64_t model_vocab);
  // Fills inputs[seq_len] and labels[seq_len] with the next sample.
  void Next(int32_t* inputs, int32_t* labels);
  int64_t position() const { return position_; }
  void set_position(int64_t p) { position_ = p; }
  int64_t seq_len() const { return seq_len_; }
  int64_t samples_per_epoch() const { return samples_per_epoch_; }

 private:
  std::unique_ptr<TokenFile> file_;
  int64_t seq_len_ = 0;
  int64_t samples_per_epoch_ = 0;
  int64_t position_ = 0;
};

}  // namespace ithaca
