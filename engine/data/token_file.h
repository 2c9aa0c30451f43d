// Token files: pre-tokenized training data, and the DataLoader that serves windows of them.
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

namespace ithaca {

inline constexpr char kTokenFileMagic[8] = {'I', 'T', 'H', 'A', 'C', 'A', 'T', 'K'};
inline constexpr uint32_t kTokenFileVersion = 2;         // what WriteTokenFileV2 writes
inline constexpr int64_t kTokenFileHeaderBytes = 32;     // version 1
inline constexpr int64_t kTokenFileV2HeaderBytes = 128;  // version 2
inline constexpr uint32_t kTokenFileFlagLossMask = 1;

using TokenizerFingerprint = std::array<uint8_t, 32>;  // SHA-256; all zero: byte-level

// SHA-256 of a file's bytes (the fingerprint of a tokenizer.json).
absl::StatusOr<TokenizerFingerprint> Sha256File(const std::string& path);
TokenizerFingerprint Sha256(const void* data, size_t n);
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

// Byte-level tokenizer for the demo and tests: token = byte value (0..255), and kByteBos (256)
// starts every document (documents are separated by blank lines). vocab_size 258.
// A document is a run of non-blank lines (a blank line is empty or only spaces, tabs and '\r');
// its tokens are BOS then every byte of its lines, newlines included. The separating blank lines
// produce no tokens, and no EOS is emitted: the next document's BOS marks the boundary.
inline constexpr uint32_t kByteBos = 256;
inline constexpr uint32_t kByteEos = 257;
inline constexpr uint32_t kByteVocab = 258;
std::vector<uint32_t> ByteTokenize(const std::string& text);
// The version 2 metadata of ByteTokenize's output: BOS 256, no EOS, a document per BOS.
TokenFileMeta ByteTokenMeta(const std::vector<uint32_t>& tokens);

// The files a data.path names: the path itself, or the files a glob pattern (*, ?, [...],
// {a,b}) matches, sorted (engine/core/path_policy.h ExpandPattern: bounded, every alternative
// must match, inside $ITHACA_ALLOWED_ROOTS when set). NOT_FOUND naming the pattern when it
// matches nothing.
absl::StatusOr<std::vector<std::string>> ExpandDataPath(const std::string& pattern);

struct DataOptions {
  bool shuffle = true;  // windows in a seeded random order, a new one each epoch
  uint64_t seed = 0;
  // The model's tokenizer.json ("" when the model has none): a file made with another
  // tokenizer is rejected.
  std::string tokenizer_json;
  // data.document_mask: a label that would cross into the next document (the last token of a
  // document predicting the next one's first) is ignored (-1), and sample_doc_starts() also
  // finds the documents of version 1 files, at every token equal to bos_id (which must then be
  // >= 0: the model's bos_token_id).
  bool document_mask = false;
  int32_t bos_id = -1;
  // data.loss_mask: labels whose token the file's loss mask marks 0 are ignored (-1). Every file
  // must have a loss mask.
  bool loss_mask = false;
  // data.byte_tokens: byte-level (or version 1) files for a model with its own tokenizer.json
  // are allowed, with a warning; otherwise they are refused.
  bool allow_byte_tokens = false;
};

// Serves samples of seq_len + 1 consecutive tokens: inputs = first seq_len, labels = the same
// window shifted by one (labels are shifted before any sequence sharding). Each file is cut into
// non-overlapping windows stepping by seq_len (a window never spans two files); an epoch visits
// every window of every file once, in file order or (shuffle) in a permutation that depends only
// on the seed and the epoch. `position` (samples served so far) is saved in checkpoints, so a
// resumed run sees the same data.
class DataLoader {
 public:
  // INVALID_ARGUMENT, naming the files, if no file holds seq_len + 1 tokens, a token is ≥
  // model_vocab, the files come from different tokenizers, or a file's tokenizer is not the
  // model's (options.tokenizer_json).
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(
      std::vector<std::unique_ptr<TokenFile>> files, int64_t seq_len, int64_t model_vocab,
      const DataOptions& options = {});
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(std::unique_ptr<TokenFile> file,
                                                            int64_t seq_len, int64_t model_vocab,
                                                            const DataOptions& options = {});
  // A weighted mix (data.weights): source i (its files, with their own windows and shuffle, seeded
  // from options.seed and i) serves slots[i] of every period = sum(slots) consecutive samples,
  // exactly. Within a period the sources take turns in smooth weighted round-robin order (each
  // slot goes to the source furthest behind its share; ties to the lower index), so [3, 1]
  // serves A A B A | A A B A ...; sample `position` is sample (position / period) × slots[s]
  // + (its rank among s's slots of the period) of its source s. A pure function of position, so
  // a resumed run (position from the checkpoint) sees the same samples. The sources must share
  // one tokenizer; each is checked as Create checks its files.
  static absl::StatusOr<std::unique_ptr<DataLoader>> CreateMix(
      std::vector<std::vector<std::unique_ptr<TokenFile>>> sources,
      const std::vector<int64_t>& slots, int64_t seq_len, int64_t model_vocab,
      const DataOptions& options = {});
  // The source and its sample index that mix sample `position` reads ({0, position} without a
  // mix; exposed for tests).
  std::pair<size_t, int64_t> SourceFor(int64_t position) const;
  size_t num_sources() const { return mix_.empty() ? 1 : mix_.size(); }

  // Fills inputs[seq_len] and labels[seq_len] with the next sample (ignored labels are -1).
  void Next(int32_t* inputs, int32_t* labels);
  // The labels that sample `position` trains (those not ignored), without serving it: the
  // trainer's pre-pass for the step's token count when masks are on.
  int64_t CountLabels(int64_t position) const;
  int64_t position() const { return position_; }
  void set_position(int64_t p) { position_ = p; }
  int64_t seq_len() const { return seq_len_; }
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  // The files, in the order their windows are numbered (i < the number of files).
  const TokenFile& file(size_t i) const { return mix_.empty() ? *files_[i] : *all_files_[i]; }
  // Things worth saying that are not errors (a byte-level file for a large-vocabulary model).
  const std::vector<std::string>& warnings() const { return warnings_; }

  // The last sample Next served: its file and the offset of inputs[0] in that file.
  const TokenFile& sample_file() const { return file(sample_file_); }
  int64_t sample_offset() const { return sample_offset_; }
  // Positions i in [0, seq_len) where inputs[i] is a document's first token, ascending (for
  // document masks). Empty for a version 1 file, which has no document index, unless
  // options.document_mask finds its documents by bos_id.
  const std::vector<int64_t>& sample_doc_starts() const { return sample_doc_starts_; }

  // Window `index` of the epoch's order, for sample `position` (exposed for tests).
  int64_t WindowFor(int64_t position) const;

 private:
  DataLoader() = default;
  // Sample `position`: its tokens, labels (with the options' masks) and document starts.
  void Read(int64_t position, int32_t* inputs, int32_t* labels, std::vector<int64_t>* doc_starts,
            size_t* file, int64_t* offset) const;
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<int64_t> first_window_;  // per file, its first window's global index; + the total
  int64_t seq_len_ = 0;
  int64_t samples_per_epoch_ = 0;
  int64_t position_ = 0;
  bool shuffle_ = true;
  uint64_t seed_ = 0;
  DataOptions options_;
  std::vector<std::string> warnings_;
  size_t sample_file_ = 0;
  int64_t sample_offset_ = 0;
  std::vector<int64_t> sample_doc_starts_;
  // A mix: its sources' loaders, every file of them in order (file(i)) and where each source's
  // files begin there; per slot of one period, its source and its rank among that source's
  // slots.
  std::vector<std::unique_ptr<DataLoader>> mix_;
  std::vector<const TokenFile*> all_files_;
  std::vector<size_t> first_file_;
  std::vector<int64_t> mix_slots_;
  std::vector<uint32_t> slot_source_, slot_rank_;
};

}  // namespace ithaca
