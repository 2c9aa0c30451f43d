// A hand-built model whose passkey answers are known, for the passkey eval's tests: its blocks
// add nothing (o_proj and down_proj zero), so the logits at a position depend only on the token
// there (a bigram model), and its untied LM head gives one chosen continuation of each token in
// `next` a large logit (d / 4 against about sqrt(d) / 4 for the others). With next = "s" -> " "
// -> the digits of a key in turn, the question "... The pass key is" is answered with that key.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/params.h"
#include "engine/model/weights.h"
#include "engine/spec/job_spec.h"
#include "engine/train/passkey.h"

namespace ithaca {

struct BigramModel {
  LlamaConfig cfg;  // untied
  HostWeights weights;
  std::vector<std::vector<double>> normed;  // each token's embedding after the final norm
  std::vector<std::vector<double>> head;    // the LM head's rows

  // At a position holding `prev`, computed on the host in double: whether `label` is the first
  // argmax of the logits, and log p(label).
  std::pair<bool, double> Score(int prev, int label) const;
};

// The tiny preset, untied, with the weights above.
BigramModel MakeBigramModel(const std::vector<std::pair<int, int>>& next);

// The first training.seed from 1 whose key of (length, depth 0, sample 0) has five distinct
// digits, so "s" -> " " -> key[0] -> ... -> key[4] is a function with a head row per target;
// and that chain.
uint64_t SeedWithChainableKey(int64_t length);
// What the passkey eval of `spec` ([eval.passkey], training.seed) must report for the model,
// computed on the host from its weights and the byte-level prompts (seconds left 0).
std::vector<PasskeyResult> ExpectedResults(const BigramModel& model, const JobSpec& spec);
std::vector<std::pair<int, int>> AnswerChain(const std::string& key);

}  // namespace ithaca
