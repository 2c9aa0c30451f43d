// The passkey eval ([eval.passkey]): does the model retrieve a key from far back in its context?
// Its prompts (engine/data/passkey_prompt.h: filler, a key sentence at a depth, the question and
// the key, exactly `length` tokens of the model's tokenizer) are scored teacher-forced: one
// forward of each prompt through the training step's schedule (LlamaModel::Forward: FSDP,
// Ulysses / UPipe, tiles, as the job trains) with labels only at the answer, so the loss head
// yields each answer token's log-probability and whether it is the argmax (Ops::LabelIsArgmax),
// never a whole sequence's logits. A sample is retrieved when all its answer tokens are the
// argmax.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/core/status.h"
#include "engine/data/passkey_prompt.h"
#include "engine/data/text_tokenizer.h"
#include "engine/schedule/llama.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

// One (keys, length, depth) point of the eval.
struct PasskeyResult {
  int64_t keys = 1;  // keys in each prompt (eval.passkey.keys): 1 the passkey test, more multi-key
  int64_t length = 0;
  double depth = 0;
  int64_t samples = 0;
  double accuracy = 0;  // share of samples whose answer tokens were all the argmax
  double logprob = 0;   // mean natural-log probability of an answer token
  double seconds = 0;   // wall time of its forwards
};

// passkey step 20, 4096 tokens: accuracy 1.00 0.75 1.00 at depths 0 0.5 1, logprob -0.01 -0.31
// -0.02, 1.20 s (one line per key count and length; a multi-key line says "4096 tokens, 4 keys").
std::vector<std::string> FormatPasskeyLines(int64_t step, const std::vector<PasskeyResult>& r);

class PasskeyEval {
 public:
  // The model's tokenizer (OpenPasskeyTokenizer) and a check that every prompt fits
  // (CheckPasskeyPrompts).
  // `model` and `world` must outlive it; `dp` and `dp_rank` are the data-parallel replicas and
  // this rank's: replica r scores samples r, r + dp, ...
  static absl::StatusOr<std::unique_ptr<PasskeyEval>> Create(const JobSpec& spec, LlamaModel* model,
                                                             Comm* world, int dp, int dp_rank);
  // The same with a given tokenizer (tests, the benchmark).
  static absl::StatusOr<std::unique_ptr<PasskeyEval>> Create(const JobSpec& spec, LlamaModel* model,
                                                             Comm* world, int dp, int dp_rank,
                                                             std::unique_ptr<TextTokenizer> tok);

  // Every (keys, length, depth) of the spec, key counts outer, then lengths. Collective: every
  // rank calls it.
  absl::StatusOr<std::vector<PasskeyResult>> Run();

  const TextTokenizer& tokenizer() const { return *tok_; }

 private:
  PasskeyEval() = default;
  absl::StatusOr<PasskeyResult> RunPoint(int64_t keys, int64_t length, int64_t depth_index);

  JobSpec::Eval::Passkey spec_;
  uint64_t seed_ = 0;
  LlamaModel* model_ = nullptr;
  Comm* world_ = nullptr;
  int dp_ = 1, dp_rank_ = 0;
  std::unique_ptr<TextTokenizer> tok_;
};

}  // namespace ithaca
