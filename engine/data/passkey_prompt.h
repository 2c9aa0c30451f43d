// The passkey eval's prompts ([eval.passkey]; scored by engine/train/passkey.h), built in the
// model's own tokenizer (TextTokenizer):
//   [BOS] filler... key sentence filler... question answer
// The filler repeats five plain sentences ("The grass is green. The sky is blue. ..."); the key
// sentence ("The pass key is 71432. Remember it. 71432 is the pass key.") sits at the filler's
// sentence boundary nearest `depth` of it (0: first, 1: last); the question is "What is the pass
// key? The pass key is" and the answer the key's tokens, which end the prompt. Each key is five
// digits drawn from training.seed, the length, the depth and the sample, so a job's prompts are
// the same every time. Admission (CheckJobInputs) and the eval check them with the same
// CheckPasskeyPrompts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/data/text_tokenizer.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

struct PasskeyPrompt {
  std::vector<int32_t> tokens;  // exactly the length asked for
  int64_t key_at = 0;           // the key sentence's first token
  int64_t filler = 0;           // filler tokens in all (before and after the key sentence)
  int64_t answer_at = 0;        // the answer's first token; the answer runs to the end
  std::string key;              // the five digits
};

// The key of one sample: five digits from the seed and the sample's place.
std::string PasskeyKey(uint64_t seed, int64_t length, int64_t depth_index, int64_t sample);

// One prompt of `length` tokens with `key` at `depth`. INVALID_ARGUMENT naming
// eval.passkey.lengths when the length cannot hold the key sentence, the question and the answer.
absl::StatusOr<PasskeyPrompt> BuildPasskeyPrompt(const TextTokenizer& tok, int64_t length,
                                                 double depth, const std::string& key);

// Every prompt of spec.eval.passkey fits its length and its tokens (BOS included) are below
// `vocab`; INVALID_ARGUMENT naming eval.passkey.lengths (the shortest length that would do) or
// eval.passkey otherwise.
absl::Status CheckPasskeyPrompts(const JobSpec& spec, const TextTokenizer& tok, int64_t vocab);

// The model's tokenizer for the prompts (OpenModelTokenizer), its errors starting with
// "eval.passkey: the model's tokenizer: ".
absl::StatusOr<std::unique_ptr<TextTokenizer>> OpenPasskeyTokenizer(const JobSpec& spec);

// Both, for admission and the trainer: OpenPasskeyTokenizer, then CheckPasskeyPrompts.
absl::Status CheckPasskeyInputs(const JobSpec& spec, int64_t vocab);

}  // namespace ithaca
