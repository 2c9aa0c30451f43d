#include "engine/train/passkey.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ithaca {

std::vector<std::string> FormatPasskeyLines(int64_t step, const std::vector<PasskeyResult>& r) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    std::vector<std::string> acc, depth, lp;
    double seconds = 0;
    for (; j < r.size() && r[j].length == r[i].length && r[j].keys == r[i].keys; ++j) {
      acc.push_back(absl::StrFormat("%.2f", r[j].accuracy));
      depth.push_back(absl::StrFormat("%g", r[j].depth));
      lp.push_back(absl::StrFormat("%.3f", r[j].logprob));
      seconds += r[j].seconds;
    }
    lines.push_back(absl::StrFormat(
        "passkey step %d, %d tokens%s: accuracy %s at depths %s, logprob %s, %d samples each, "
        "%.2f s",
        step, r[i].length, r[i].keys > 1 ? absl::StrFormat(", %d keys", r[i].keys) : "",
        absl::StrJoin(acc, " "), absl::StrJoin(depth, " "), absl::StrJoin(lp, " "), r[i].samples,
        seconds));
    i = j;
  }
  return lines;
}

absl::StatusOr<std::unique_ptr<PasskeyEval>> PasskeyEval::Create(const JobSpec& spec,
                                                                 LlamaModel* model, Comm* world,
                                                                 int dp, int dp_rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<TextTokenizer> tok, OpenPasskeyTokenizer(spec));
  return Create(spec, model, world, dp, dp_rank, std::move(tok));
}

absl::StatusOr<std::unique_ptr<PasskeyEval>> PasskeyEval::Create(
    const JobSpec& spec, LlamaModel* model, Comm* world, int dp, int dp_rank,
    std::unique_ptr<TextTokenizer> tok) {
  std::unique_ptr<PasskeyEval> e(new PasskeyEval());
  e->spec_ = spec.eval.passkey;
  e->seed_ = spec.training.seed;
  e->model_ = model;
  e->world_ = world;
  e->dp_ = dp;
  e->dp_rank_ = dp_rank;
  e->tok_ = std::move(tok);
  // Every prompt fits its length, and its tokens the vocabulary (admission checked the same).
  RETURN_IF_ERROR(CheckPasskeyPrompts(spec, *e->tok_, model->config().vocab_size));
  return e;
}

absl::StatusOr<std::vector<PasskeyResult>> PasskeyEval::Run() {
  std::vector<PasskeyResult> out;
  for (int64_t keys : spec_.keys) {
    for (int64_t length : spec_.lengths) {
      for (size_t d = 0; d < spec_.depths.size(); ++d) {
        ASSIGN_OR_RETURN(PasskeyResult r, RunPoint(keys, length, static_cast<int64_t>(d)));
        out.push_back(r);
      }
    }
  }
  return out;
}

absl::StatusOr<PasskeyResult> PasskeyEval::RunPoint(int64_t keys, int64_t length,
                                                    int64_t depth_index) {
  const auto start = std::chrono::steady_clock::now();
  Ops* ops = model_->ops();
  const int64_t n = spec_.samples;
  const double depth = spec_.depths[depth_index];
  // Per sample its loss sum and hit count ([2k], [2k + 1]); a replica left without a sample in
  // the last round still runs the forward (its collectives are every rank's) into [2n, 2n + 1].
  ASSIGN_OR_RETURN(Buffer sums,
                   Buffer::Make(model_->allocator(), DType::kF32, {2 * n + 2}, Tier::kActivations));
  ops->Fill(sums.tensor(), 0.f);
  std::vector<int64_t> answer_tokens(n);
  std::vector<int32_t> labels(length);
  const int64_t rounds = (n + dp_ - 1) / dp_;
  for (int64_t round = 0; round < rounds; ++round) {
    // Every rank knows every sample's answer length, for the verdicts after the reduction.
    for (int64_t k = round * dp_; k < std::min(n, (round + 1) * dp_); ++k) {
      ASSIGN_OR_RETURN(std::vector<int32_t> a,
                       tok_->Encode(" " + SamplePasskeyKey(seed_, keys, length, depth_index, k)));
      answer_tokens[k] = static_cast<int64_t>(a.size());
    }
    const int64_t k = round * dp_ + dp_rank_;
    const bool real = k < n;
    ASSIGN_OR_RETURN(PasskeyPrompt p, SamplePasskeyPrompt(*tok_, seed_, keys, length, depth_index,
                                                          depth, real ? k : n - 1));
    // Labels are the next tokens, only where the next token is the answer's.
    std::fill(labels.begin(), labels.end(), -1);
    for (int64_t i = p.answer_at - 1; i + 1 < length; ++i) labels[i] = p.tokens[i + 1];
    ASSIGN_OR_RETURN(DeviceSample sample,
                     model_->UploadSample(p.tokens.data(), labels.data(), length));
    const int64_t slot = real ? 2 * k : 2 * n;
    RETURN_IF_ERROR(model_->Forward(sample, sums.tensor().Slice(slot, {1}),
                                    sums.tensor().Slice(slot + 1, {1})));
  }
  const Tensor mine = sums.tensor().Slice(0, {2 * n});
  if (world_ != nullptr && world_->size() > 1) RETURN_IF_ERROR(world_->AllReduce(mine));
  std::vector<float> host(2 * n);
  ops->Download(mine, host.data(), DType::kF32);
  PasskeyResult r;
  r.keys = keys;
  r.length = length;
  r.depth = depth;
  r.samples = n;
  double loss = 0;
  int64_t tokens = 0, right = 0;
  for (int64_t k = 0; k < n; ++k) {
    loss += host[2 * k];
    tokens += answer_tokens[k];
    if (std::lround(host[2 * k + 1]) == answer_tokens[k]) ++right;
  }
  r.accuracy = static_cast<double>(right) / static_cast<double>(n);
  r.logprob = -loss / static_cast<double>(std::max<int64_t>(1, tokens));
  if (!std::isfinite(r.logprob)) {
    return absl::DataLossError(absl::StrCat("passkey eval at ", length, " tokens, ", keys,
                                            " keys, depth ", depth, ": the log-probability is ",
                                            r.logprob));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace ithaca
