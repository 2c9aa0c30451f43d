#include "engine/train/passkey_testing.h"

#include <cmath>
#include <set>

#include "engine/data/byte_tokenizer.h"
#include "engine/train/passkey.h"

namespace ithaca {

BigramModel MakeBigramModel(const std::vector<std::pair<int, int>>& next) {
  BigramModel b;
  b.cfg = *PresetConfig("tiny");
  b.cfg.tie_word_embeddings = false;
  const ParamLayout layout(b.cfg);
  b.weights = RandomWeights(layout, 11);
  const int64_t d = b.cfg.hidden_size, V = b.cfg.vocab_size;
  float *embed = nullptr, *head = nullptr;
  for (size_t u = 0; u < b.weights.size(); ++u) {
    for (const ParamEntry& e : layout.units()[u].entries) {
      float* p = b.weights[u].data() + e.offset;
      const std::string& n = e.hf_name;
      if (n.find("o_proj") != std::string::npos || n.find("down_proj") != std::string::npos) {
        std::fill(p, p + NumElements(e.shape), 0.f);
      } else if (n == "model.embed_tokens.weight") {
        embed = p;
        for (int64_t i = 0; i < V * d; ++i) p[i] *= 50.f;  // well above the norm's eps
      } else if (n == "lm_head.weight") {
        head = p;
      } else if (n == "model.norm.weight") {
        std::fill(p, p + d, 1.f);
      }
    }
  }
  b.normed.assign(V, std::vector<double>(d));
  for (int64_t v = 0; v < V; ++v) {
    const float* e = embed + v * d;
    double ms = 0;
    for (int64_t i = 0; i < d; ++i) ms += double(e[i]) * e[i];
    const double r = 1.0 / std::sqrt(ms / d + b.cfg.rms_norm_eps);
    for (int64_t i = 0; i < d; ++i) b.normed[v][i] = e[i] * r;
  }
  std::fill(head, head + V * d, 0.f);
  for (auto [p, q] : next) {
    for (int64_t i = 0; i < d; ++i) head[q * d + i] = static_cast<float>(b.normed[p][i] / 4);
  }
  b.head.assign(V, std::vector<double>(d));
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t i = 0; i < d; ++i) b.head[v][i] = head[v * d + i];
  }
  return b;
}

std::pair<bool, double> BigramModel::Score(int prev, int label) const {
  const int64_t V = cfg.vocab_size;
  std::vector<double> logits(V);
  for (int64_t v = 0; v < V; ++v) {
    double s = 0;
    for (size_t i = 0; i < normed[prev].size(); ++i) s += normed[prev][i] * head[v][i];
    logits[v] = s;
  }
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v) {
    if (logits[v] > logits[best]) best = v;
  }
  const double mx = logits[best];
  double sum = 0;
  for (double l : logits) sum += std::exp(l - mx);
  return {best == label, logits[label] - mx - std::log(sum)};
}

uint64_t SeedWithChainableKey(int64_t length) {
  for (uint64_t seed = 1;; ++seed) {
    const std::string key = PasskeyKey(seed, length, 0, 0);
    if (std::set<char>(key.begin(), key.end()).size() == 5) return seed;
  }
}

std::vector<PasskeyResult> ExpectedResults(const BigramModel& model, const JobSpec& spec) {
  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  const JobSpec::Eval::Passkey& pk = spec.eval.passkey;
  std::vector<PasskeyResult> out;
  for (int64_t keys : pk.keys) {
    for (int64_t length : pk.lengths) {
      for (size_t d = 0; d < pk.depths.size(); ++d) {
        PasskeyResult r;
        r.keys = keys;
        r.length = length;
        r.depth = pk.depths[d];
        r.samples = pk.samples;
        int64_t right = 0, tokens = 0;
        double logprob = 0;
        for (int64_t k = 0; k < pk.samples; ++k) {
          absl::StatusOr<PasskeyPrompt> p = SamplePasskeyPrompt(
              *tok, spec.training.seed, keys, length, static_cast<int64_t>(d), r.depth, k);
          if (!p.ok()) return {};
          bool all = true;
          for (int64_t i = p->answer_at; i < length; ++i) {
            auto [hit, lp] = model.Score(p->tokens[i - 1], p->tokens[i]);
            all = all && hit;
            logprob += lp;
            ++tokens;
          }
          right += all;
        }
        r.accuracy = static_cast<double>(right) / static_cast<double>(pk.samples);
        r.logprob = logprob / static_cast<double>(tokens);
        out.push_back(r);
      }
    }
  }
  return out;
}

std::vector<std::pair<int, int>> AnswerChain(const std::string& key) {
  std::vector<std::pair<int, int>> next = {{'s', ' '}, {' ', key[0]}};
  for (size_t i = 0; i + 1 < key.size(); ++i) next.push_back({key[i], key[i + 1]});
  return next;
}

}  // namespace ithaca
