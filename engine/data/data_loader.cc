#include "engine/data/data_loader.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/core/path_policy.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/permutation.h"

namespace ithaca {

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
  if (!options.source_loss_mask.empty() && options.source_loss_mask.size() != sources.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.source_loss_mask: ", options.source_loss_mask.size(), " values for ",
                     sources.size(), " sources"));
  }
  auto loader = std::unique_ptr<DataLoader>(new DataLoader());
  for (size_t i = 0; i < sources.size(); ++i) {
    DataOptions o = options;
    o.seed = SplitMix64(options.seed ^ SplitMix64(0x6d6978ULL + i));  // "mix" + i
    if (!options.source_loss_mask.empty()) {
      // Each source by its own entry, checked here so the error names the source.
      o.loss_mask = options.source_loss_mask[i];
      o.source_loss_mask.clear();
      for (const auto& f : sources[i]) {
        if (!f) continue;  // Create refuses it
        if (o.loss_mask && f->loss_mask() == nullptr) {
          return absl::InvalidArgumentError(absl::StrCat(
              "data.source_loss_mask: source ", i + 1, " (", f->path(),
              ") is marked true (SFT: only the loss mask's tokens trained) but the file has no "
              "loss mask: make it with ithaca-tokenize --sft, or mark the source false to "
              "train every label"));
        }
        if (!o.loss_mask && f->loss_mask() != nullptr) {
          loader->warnings_.push_back(absl::StrCat(
              "data.source_loss_mask: source ", i + 1, " (", f->path(),
              ") is marked false, so every label is trained, but the file carries a loss "
              "mask (made with ithaca-tokenize --sft): mark it true to train only what the "
              "mask marks"));
        }
      }
    }
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
  // CountLabels's shortcut holds only when no source masks its labels.
  for (const auto& source : loader->mix_) {
    loader->options_.loss_mask = loader->options_.loss_mask || source->options_.loss_mask;
  }
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
