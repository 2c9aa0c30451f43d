#include "engine/data/passkey_prompt.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

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

absl::Status CheckPasskeyPrompts(const JobSpec& spec, const TextTokenizer& tok, int64_t vocab) {
  const JobSpec::Eval::Passkey& pk = spec.eval.passkey;
  if (tok.bos() >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("eval.passkey: the tokenizer's BOS ", tok.bos(), " (", tok.name(),
                     ") is outside the model's vocabulary of ", vocab));
  }
  std::vector<int32_t> filler;
  for (const char* s : kFiller) {
    ASSIGN_OR_RETURN(std::vector<int32_t> t, tok.Encode(s));
    filler.insert(filler.end(), t.begin(), t.end());
  }
  for (int64_t length : pk.lengths) {
    for (size_t d = 0; d < pk.depths.size(); ++d) {
      for (int64_t k = 0; k < pk.samples; ++k) {
        const std::string key = PasskeyKey(spec.training.seed, length, static_cast<int64_t>(d), k);
        ASSIGN_OR_RETURN(Pieces p, EncodePieces(tok, key));
        const int64_t need =
            (tok.bos() >= 0 ? 1 : 0) +
            static_cast<int64_t>(p.key_sentence.size() + p.question.size() + p.answer.size());
        if (length < need) {
          return absl::InvalidArgumentError(absl::StrCat(
              "eval.passkey.lengths: ", length,
              " tokens cannot hold a passkey prompt: its key sentence, question and answer take ",
              need, " tokens of the model's tokenizer (", tok.name(), "); use lengths of at least ",
              need));
        }
        for (const auto* piece : {&p.key_sentence, &p.question, &p.answer, &filler}) {
          for (int32_t id : *piece) {
            if (id < 0 || id >= vocab) {
              return absl::InvalidArgumentError(
                  absl::StrCat("eval.passkey: the tokenizer (", tok.name(), ") gives token ", id,
                               ", outside the model's vocabulary of ", vocab));
            }
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TextTokenizer>> OpenPasskeyTokenizer(const JobSpec& spec) {
  absl::StatusOr<std::unique_ptr<TextTokenizer>> tok = OpenModelTokenizer(spec);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), absl::StrCat("eval.passkey: the model's tokenizer: ",
                                                          tok.status().message()));
  }
  return tok;
}

absl::Status CheckPasskeyInputs(const JobSpec& spec, int64_t vocab) {
  ASSIGN_OR_RETURN(std::unique_ptr<TextTokenizer> tok, OpenPasskeyTokenizer(spec));
  return CheckPasskeyPrompts(spec, *tok, vocab);
}

}  // namespace ithaca
