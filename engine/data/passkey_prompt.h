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
//
// Multi-key retrieval (eval.passkey.keys above 1): k numbered key sentences ("The pass key
// number 3 is 71432. Remember it. 71432 is pass key number 3.") with k distinct keys; the asked
// one (its number drawn from the seed, so the number says nothing of where it sits) at the
// boundary nearest `depth`, the other k - 1 at the boundaries nearest (i + 0.5) / (k - 1) of the
// filler, i = 0 .. k - 2, in number order; the question is "What is pass key number 3? Pass key
// number 3 is" and the answer the asked key. The model must tell the keys apart, not just find
// the one number in the text.
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
  std::string key;              // the five digits (of the asked key)
  int64_t asked = 0;            // multi-key: the asked key's number (from 1); 0: a single key
};

// The key of one sample: five digits from the seed and the sample's place.
std::string PasskeyKey(uint64_t seed, int64_t length, int64_t depth_index, int64_t sample);

// One prompt of `length` tokens with `key` at `depth`. INVALID_ARGUMENT naming
// eval.passkey.lengths when the length cannot hold the key sentence, the question and the answer.
absl::StatusOr<PasskeyPrompt> BuildPasskeyPrompt(const TextTokenizer& tok, int64_t length,
                                                 double depth, const std::string& key);

// The prompt of one sample of [eval.passkey]: with `keys` 1 BuildPasskeyPrompt of PasskeyKey,
// with more the multi-key prompt above (its keys and asked number from the same place).
absl::StatusOr<PasskeyPrompt> SamplePasskeyPrompt(const TextTokenizer& tok, uint64_t seed,
                                                  int64_t keys, int64_t length, int64_t depth_index,
                                                  double depth, int64_t sample);

// The asked key of that sample (SamplePasskeyPrompt's `key`) without building its prompt.
std::string SamplePasskeyKey(uint64_t seed, int64_t keys, int64_t length, int64_t depth_index,
                             int64_t sample);

// Every prompt of spec.eval.passkey (each of eval.passkey.keys) fits its length and its tokens (BOS
// included) are below `vocab`; INVALID_ARGUMENT naming eval.passkey.lengths (the shortest length
// that would do) or eval.passkey otherwise.
absl::Status CheckPasskeyPrompts(const JobSpec& spec, const TextTokenizer& tok, int64_t vocab);

// The model's tokenizer for the prompts (OpenModelTokenizer), its errors starting with
// "eval.passkey: the model's tokenizer: ".
absl::StatusOr<std::unique_ptr<TextTokenizer>> OpenPasskeyTokenizer(const JobSpec& spec);

// Both, for admission and the trainer: OpenPasskeyTokenizer, then CheckPasskeyPrompts.
absl::Status CheckPasskeyInputs(const JobSpec& spec, int64_t vocab);

}  // namespace ithaca
