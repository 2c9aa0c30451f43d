// The text encoder of a job's model, for text the engine writes itself (the passkey eval's
// prompts, engine/train/passkey.h). Token files are made by ithaca-tokenize; this encodes a few
// sentences the same way in C++, so a rank needs no Python:
//   - the byte-level tokenizer (ByteTokenize without its BOS): every byte a token;
//   - a model's tokenizer.json of the byte-level BPE kind (GPT-2, Llama 3, Qwen2/2.5/3: model
//     type "BPE" with merges, a ByteLevel pre-tokenizer, alone or after a Split by a regex), for
//     ASCII text: the pre-tokenizer's pattern is recognised among the known ones rather than
//     run as a regex.
// Other tokenizer.json kinds (SentencePiece-style Metaspace, WordPiece, Unigram) are refused
// with a message naming what was found.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // The tokens of `text` with no BOS or EOS.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(const std::string& text) const = 0;
  // The token that starts a document, or -1 when the tokenizer adds none.
  virtual int32_t bos() const = 0;
  // "byte-level" or the tokenizer.json's path.
  virtual std::string name() const = 0;
};

// The byte-level tokenizer: token = byte, BOS kByteBos (256).
std::unique_ptr<TextTokenizer> MakeByteTokenizer();

// A tokenizer.json of the byte-level BPE kind (read whole, at most kMaxTokenizerBytes). Its BOS
// is the special token its post-processor's template starts with (Llama 3's
// <|begin_of_text|>), else none (Qwen's).
absl::StatusOr<std::unique_ptr<TextTokenizer>> LoadBpeTokenizer(const std::string& json_path);

// The directory the job's model comes from (of model.config, or model.weights itself when it is
// a directory, else its directory); "" for a preset with random weights.
std::string ModelSourceDir(const JobSpec& spec);

// The model directory's tokenizer.json (beside model.config, or in / beside model.weights), or
// "" when there is none; token files made with another tokenizer are rejected against it.
std::string ModelTokenizerJson(const JobSpec& spec);

// The job's model's tokenizer: its tokenizer.json (ModelTokenizerJson) unless data.byte_tokens
// or it has none, then the byte-level one.
absl::StatusOr<std::unique_ptr<TextTokenizer>> OpenModelTokenizer(const JobSpec& spec);

}  // namespace ithaca
