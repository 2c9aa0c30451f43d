#include "engine/train/passkey.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace ithaca {
namespace {

// The filler's sentences, each after a space so that they join as running text.
const char* const kFiller[] = {" The grass is green.", " The sky is blue.", " The sun is yellow.",
                               " Here we go.", " There and back again."};

uint64_t Mix(uint64_t x) {  // SplitMix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The prompt's pieces other than the filler.
struct Pieces {
  std::vector<int32_t> key_sentence, question, answer;
};

absl::StatusOr<Pieces> EncodePieces(const TextTokenizer& tok, const std::string& key) {
  Pieces p;
  ASSIGN_OR_RETURN(p.key_sentence,
                   tok.Encode(absl::StrCat(" The pass key is ", key, ". Remember it. ", key,
                                           " is the pass key.")));
  ASSIGN_OR_RETURN(p.question, tok.Encode(" What is the pass key? The pass key is"));
  ASSIGN_OR_RETURN(p.answer, tok.Encode(absl::StrCat(" ", key)));
  return p;
}

}  // namespace

std::string PasskeyKey(uint64_t seed, int64_t length, int64_t depth_index, int64_t sample) {
  uint64_t h = Mix(seed);
  for (int64_t v : {length, depth_index, sample}) h = Mix(h ^ static_cast<uint64_t>(v));
  return absl::StrCat(10000 + h % 90000);
}

absl::StatusOr<PasskeyPrompt> BuildPasskeyPrompt(const TextTokenizer& tok, int64_t length,
                                                 double depth, const std::string& key) {
  ASSIGN_OR_RETURN(Pieces p, EncodePieces(tok, key));
  // The filler as one repeating unit of whole sentences, and where each sentence ends in it.
  std::vector<int32_t> unit;
  std::vector<int64_t> ends;
  for (const char* s : kFiller) {
    ASSIGN_OR_RETURN(std::vector<int32_t> t, tok.Encode(s));
    unit.insert(unit.end(), t.begin(), t.end());
    ends.push_back(static_cast<int64_t>(unit.size()));
  }
  const int64_t bos = tok.bos() >= 0 ? 1 : 0;
  const int64_t fixed =
      bos + static_cast<int64_t>(p.key_sentence.size() + p.question.size() + p.answer.size());
  if (length < fixed) {
    return absl::InvalidArgumentError(absl::StrCat("eval.passkey.lengths: ", length,
                                                   " tokens cannot hold a passkey prompt: its key "
                                                   "sentence, question and answer take ",
                                                   fixed, " tokens of the model's tokenizer (",
                                                   tok.name(), ")"));
  }
  PasskeyPrompt out;
  out.key = key;
  out.filler = length - fixed;
  // The sentence boundary nearest depth · filler, not past the filler's end.
  const int64_t U = static_cast<int64_t>(unit.size());
  const double target = depth * static_cast<double>(out.filler);
  int64_t at = 0;
  for (int64_t base = std::max<int64_t>(0, static_cast<int64_t>(target / U) - 1) * U;
       base <= static_cast<int64_t>(target) + U; base += U) {
    for (int64_t e : ends) {
      for (int64_t b : {base, base + e}) {
        if (b <= out.filler && std::abs(b - target) < std::abs(at - target)) at = b;
      }
    }
  }
  std::vector<int32_t>& t = out.tokens;
  t.reserve(length);
  if (bos) t.push_back(tok.bos());
  auto filler = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) t.push_back(unit[i % U]);
  };
  filler(0, at);
  out.key_at = static_cast<int64_t>(t.size());
  t.insert(t.end(), p.key_sentence.begin(), p.key_sentence.end());
  filler(at, out.filler);
  t.insert(t.end(), p.question.begin(), p.question.end());
  out.answer_at = static_cast<int64_t>(t.size());
  t.insert(t.end(), p.answer.begin(), p.answer.end());
  return out;
}

std::vector<std::string> FormatPasskeyLines(int64_t step, const std::vector<PasskeyResult>& r) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < r.size();) {
    size_t j = i;
    std::vector<std::string> acc, depth, lp;
    double seconds = 0;
    for (; j < r.size() && r[j].length == r[i].length; ++j) {
      acc.push_back(absl::StrFormat("%.2f", r[j].accuracy));
      depth.push_back(absl::StrFormat("%g", r[j].depth));
      lp.push_back(absl::StrFormat("%.3f", r[j].logprob));
      seconds += r[j].seconds;
    }
    lines.push_back(absl::StrFormat(
        "passkey step %d, %d tokens: accuracy %s at depths %s, logprob %s, %d samples each, "
        "%.2f s",
        step, r[i].length, absl::StrJoin(acc, " "), absl::StrJoin(depth, " "),
        absl::StrJoin(lp, " "), r[i].samples, seconds));
    i = j;
  }
  return lines;
}

absl::StatusOr<std::unique_ptr<PasskeyEval>> PasskeyEval::Create(const JobSpec& spec,
                                                                 LlamaModel* model, Comm* world,
                                                                 int dp, int dp_rank) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = OpenModelTokenizer(spec);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat("eval.passkey: the model's tokenizer: ",
                                                          tok.status().message()));
  }
  return Create(spec, model, world, dp, dp_rank, std::move(*tok));
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
  const int64_t vocab = model->config().vocab_size;
  if (e->tok_->bos() >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval.passkey: the tokenizer's BOS ", e->tok_->bos(), " (", e->tok_->name(),
                     ") is outside the model's vocabulary of ", vocab));
  }
  // Every prompt fits its length, and its tokens the vocabulary: checked now, before training,
  // from the pieces alone (the filler is the same for all).
  for (int64_t length : e->spec_.lengths) {
    for (size_t d = 0; d < e->spec_.depths.size(); ++d) {
      for (int64_t k = 0; k < e->spec_.samples; ++k) {
        const std::string key = PasskeyKey(e->seed_, length, static_cast<int64_t>(d), k);
        ASSIGN_OR_RETURN(Pieces p, EncodePieces(*e->tok_, key));
        const int64_t need =
            (e->tok_->bos() >= 0 ? 1 : 0) +
            static_cast<int64_t>(p.key_sentence.size() + p.question.size() + p.answer.size());
        if (length < need) {
          return absl::InvalidArgumentError(
              absl::StrCat("eval.passkey.lengths: ", length,
                           " tokens cannot hold a passkey prompt: its key "
                           "sentence, question and answer take ",
                           need, " tokens of the model's tokenizer (", e->tok_->name(),
                           "); use lengths of at least ", need));
        }
        for (const auto* piece : {&p.key_sentence, &p.question, &p.answer}) {
          for (int32_t id : *piece) {
            if (id < 0 || id >= vocab) {
              return absl::InvalidArgumentError(
                  absl::StrCat("eval.passkey: the tokenizer (", e->tok_->name(), ") gives token ",
                               id, ", outside the model's vocabulary of ", vocab));
            }
          }
        }
      }
    }
  }
  return e;
}

absl::StatusOr<std::vector<PasskeyResult>> PasskeyEval::Run() {
  std::vector<PasskeyResult> out;
  for (int64_t length : spec_.lengths) {
    for (size_t d = 0; d < spec_.depths.size(); ++d) {
      ASSIGN_OR_RETURN(PasskeyResult r, RunPoint(length, static_cast<int64_t>(d)));
      out.push_back(r);
    }
  }
  return out;
}

absl::StatusOr<PasskeyResult> PasskeyEval::RunPoint(int64_t length, int64_t depth_index) {
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
                       tok_->Encode(" " + PasskeyKey(seed_, length, depth_index, k)));
      answer_tokens[k] = static_cast<int64_t>(a.size());
    }
    const int64_t k = round * dp_ + dp_rank_;
    const bool real = k < n;
    const std::string key = PasskeyKey(seed_, length, depth_index, real ? k : n - 1);
    ASSIGN_OR_RETURN(PasskeyPrompt p, BuildPasskeyPrompt(*tok_, length, depth, key));
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
    return absl::DataLossError(absl::StrCat("passkey eval at ", length, " tokens, depth ", depth,
                                            ": the log-probability is ", r.logprob));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace ithaca
