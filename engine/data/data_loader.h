// The DataLoader: windows of token files (engine/data/token_file.h) served as training samples,
// with documents, masks, shuffling, sharding and weighted mixes, and the files a data.path names.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"
#include "engine/data/token_file.h"

namespace ithaca {

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
  // data.source_loss_mask, for CreateMix: per source, whether its labels are masked as
  // loss_mask masks them (every file of it must then carry a mask) or all trained. Empty:
  // loss_mask for every source.
  std::vector<bool> source_loss_mask;
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
  // one tokenizer; each is checked as Create checks its files. With options.source_loss_mask,
  // each source masks its labels or not by its own entry: a masked source whose file has no
  // loss mask is refused naming the source and the file; an unmasked one whose files carry a
  // mask trains every label all the same, with a warning.
  static absl::StatusOr<std::unique_ptr<DataLoader>> CreateMix(
      std::vector<std::vector<std::unique_ptr<TokenFile>>> sources,
      const std::vector<int64_t>& slots, int64_t seq_len, int64_t model_vocab,
      const DataOptions& options = {});
  // The source and its sample index that mix sample `position` reads ({0, position} without a
  // mix; exposed for tests).
  std::pair<size_t, int64_t> SourceFor(int64_t position) const;
  size_t num_sources() const { return mix_.empty() ? 1 : mix_.size(); }
  // Whether source i's labels follow its files' loss masks.
  bool source_masked(size_t i) const {
    return mix_.empty() ? options_.loss_mask : mix_[i]->options_.loss_mask;
  }

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
