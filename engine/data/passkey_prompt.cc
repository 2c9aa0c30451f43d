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

// The multi-key pieces: every key's sentence in number order, the question and the answer.
struct MultiPieces {
  std::vector<std::vector<int32_t>> sentences;
  std::vector<int32_t> question, answer;
  int64_t size() const {
    int64_t n = static_cast<int64_t>(question.size() + answer.size());
    for (const auto& t : sentences) n += static_cast<int64_t>(t.size());
    return n;
  }
};

// A sample's keys (distinct) and the asked key's index.
struct SampleKeys {
  std::vector<std::string> keys;
  int64_t asked = 0;
};

SampleKeys MultiKeys(uint64_t seed, int64_t keys, int64_t length, int64_t depth_index,
                     int64_t sample) {
  uint64_t h = Mix(seed ^ 0x6D756C74696B6579ull);  // "multikey": apart from PasskeyKey's draws
  for (int64_t v : {keys, length, depth_index, sample}) h = Mix(h ^ static_cast<uint64_t>(v));
  SampleKeys out;
  out.asked = static_cast<int64_t>(h % static_cast<uint64_t>(keys));
  while (static_cast<int64_t>(out.keys.size()) < keys) {
    h = Mix(h);
    std::string key = absl::StrCat(10000 + h % 90000);
    if (std::find(out.keys.begin(), out.keys.end(), key) == out.keys.end()) {
      out.keys.push_back(std::move(key));
    }
  }
  return out;
}

absl::StatusOr<MultiPieces> EncodeMultiPieces(const TextTokenizer& tok, const SampleKeys& k) {
  MultiPieces p;
  for (size_t j = 0; j < k.keys.size(); ++j) {
    ASSIGN_OR_RETURN(
        std::vector<int32_t> t,
        tok.Encode(absl::StrCat(" The pass key number ", j + 1, " is ", k.keys[j],
                                ". Remember it. ", k.keys[j], " is pass key number ", j + 1, ".")));
    p.sentences.push_back(std::move(t));
  }
  const int64_t n = k.asked + 1;
  ASSIGN_OR_RETURN(p.question, tok.Encode(absl::StrCat(" What is pass key number ", n,
                                                       "? Pass key number ", n, " is")));
  ASSIGN_OR_RETURN(p.answer, tok.Encode(absl::StrCat(" ", k.keys[k.asked])));
  return p;
}

// The filler as one repeating unit of whole sentences, and where each sentence ends in it.
struct Filler {
  std::vector<int32_t> unit;
  std::vector<int64_t> ends;
};

absl::StatusOr<Filler> EncodeFiller(const TextTokenizer& tok) {
  Filler f;
  for (const char* s : kFiller) {
    ASSIGN_OR_RETURN(std::vector<int32_t> t, tok.Encode(s));
    f.unit.insert(f.unit.end(), t.begin(), t.end());
    f.ends.push_back(static_cast<int64_t>(f.unit.size()));
  }
  return f;
}

// The filler's sentence boundary nearest depth · filler, not past the filler's end.
int64_t NearestBoundary(const Filler& f, int64_t filler, double depth) {
  const int64_t U = static_cast<int64_t>(f.unit.size());
  const double target = depth * static_cast<double>(filler);
  int64_t at = 0;
  for (int64_t base = std::max<int64_t>(0, static_cast<int64_t>(target / U) - 1) * U;
       base <= static_cast<int64_t>(target) + U; base += U) {
    for (int64_t e : f.ends) {
      for (int64_t b : {base, base + e}) {
        if (b <= filler && std::abs(b - target) < std::abs(at - target)) at = b;
      }
    }
  }
  return at;
}

std::string TooShort(int64_t length, int64_t need, const TextTokenizer& tok) {
  return absl::StrCat("eval.passkey.lengths: ", length,
                      " tokens cannot hold a passkey prompt: its key sentence, question and "
                      "answer take ",
                      need, " tokens of the model's tokenizer (", tok.name(), ")");
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
  ASSIGN_OR_RETURN(Filler f, EncodeFiller(tok));
  const int64_t bos = tok.bos() >= 0 ? 1 : 0;
  const int64_t fixed =
      bos + static_cast<int64_t>(p.key_sentence.size() + p.question.size() + p.answer.size());
  if (length < fixed) return absl::InvalidArgumentError(TooShort(length, fixed, tok));
  PasskeyPrompt out;
  out.key = key;
  out.filler = length - fixed;
  const int64_t at = NearestBoundary(f, out.filler, depth);
  const int64_t U = static_cast<int64_t>(f.unit.size());
  std::vector<int32_t>& t = out.tokens;
  t.reserve(length);
  if (bos) t.push_back(tok.bos());
  auto filler = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < to; ++i) t.push_back(f.unit[i % U]);
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

std::string SamplePasskeyKey(uint64_t seed, int64_t keys, int64_t length, int64_t depth_index,
                             int64_t sample) {
  if (keys <= 1) return PasskeyKey(seed, length, depth_index, sample);
  const SampleKeys k = MultiKeys(seed, keys, length, depth_index, sample);
  return k.keys[k.asked];
}

absl::StatusOr<PasskeyPrompt> SamplePasskeyPrompt(const TextTokenizer& tok, uint64_t seed,
                                                  int64_t keys, int64_t length, int64_t depth_index,
                                                  double depth, int64_t sample) {
  if (keys <= 1) {
    return BuildPasskeyPrompt(tok, length, depth, PasskeyKey(seed, length, depth_index, sample));
  }
  const SampleKeys k = MultiKeys(seed, keys, length, depth_index, sample);
  ASSIGN_OR_RETURN(MultiPieces p, EncodeMultiPieces(tok, k));
  ASSIGN_OR_RETURN(Filler f, EncodeFiller(tok));
  const int64_t bos = tok.bos() >= 0 ? 1 : 0;
  const int64_t fixed = bos + p.size();
  if (length < fixed) return absl::InvalidArgumentError(TooShort(length, fixed, tok));
  PasskeyPrompt out;
  out.key = k.keys[k.asked];
  out.asked = k.asked + 1;
  out.filler = length - fixed;
  // (boundary, key index): the asked key first, so it leads a boundary it shares.
  std::vector<std::pair<int64_t, int64_t>> at = {{NearestBoundary(f, out.filler, depth), k.asked}};
  int64_t i = 0;
  for (int64_t j = 0; j < keys; ++j) {
    if (j == k.asked) continue;
    const double d = (static_cast<double>(i++) + 0.5) / static_cast<double>(keys - 1);
    at.push_back({NearestBoundary(f, out.filler, d), j});
  }
  std::stable_sort(at.begin(), at.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const int64_t U = static_cast<int64_t>(f.unit.size());
  std::vector<int32_t>& t = out.tokens;
  t.reserve(length);
  if (bos) t.push_back(tok.bos());
  int64_t done = 0;  // filler tokens written
  for (const auto& [boundary, j] : at) {
    for (; done < boundary; ++done) t.push_back(f.unit[done % U]);
    if (j == k.asked) out.key_at = static_cast<int64_t>(t.size());
    t.insert(t.end(), p.sentences[j].begin(), p.sentences[j].end());
  }
  for (; done < out.filler; ++done) t.push_back(f.unit[done % U]);
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
  for (int64_t keys : pk.keys) {
    for (int64_t length : pk.lengths) {
      for (size_t d = 0; d < pk.depths.size(); ++d) {
        for (int64_t k = 0; k < pk.samples; ++k) {
          // The prompt's pieces other than the filler: the key sentence(s), question and answer.
          std::vector<std::vector<int32_t>> pieces;
          if (keys <= 1) {
            const std::string key =
                PasskeyKey(spec.training.seed, length, static_cast<int64_t>(d), k);
            ASSIGN_OR_RETURN(Pieces p, EncodePieces(tok, key));
            pieces = {p.key_sentence, p.question, p.answer};
          } else {
            ASSIGN_OR_RETURN(MultiPieces p,
                             EncodeMultiPieces(tok, MultiKeys(spec.training.seed, keys, length,
                                                              static_cast<int64_t>(d), k)));
            pieces = std::move(p.sentences);
            pieces.push_back(p.question);
            pieces.push_back(p.answer);
          }
          int64_t need = tok.bos() >= 0 ? 1 : 0;
          for (const auto& piece : pieces) need += static_cast<int64_t>(piece.size());
          if (length < need) {
            return absl::InvalidArgumentError(absl::StrCat(
                "eval.passkey.lengths: ", length, " tokens cannot hold a passkey prompt",
                keys > 1 ? absl::StrCat(" of ", keys, " keys") : "", ": its key sentence",
                keys > 1 ? "s" : "", ", question and answer take ", need,
                " tokens of the model's tokenizer (", tok.name(), "); use lengths of at least ",
                need));
          }
          pieces.push_back(filler);
          for (const auto& piece : pieces) {
            for (int32_t id : piece) {
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
