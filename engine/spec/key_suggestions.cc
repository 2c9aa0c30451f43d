// "Did you mean ...?" for an unknown key: the keys renamed since older specs, the names other
// trainers use for ours, and typos within a small edit distance.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "engine/spec/job_spec_internal.h"

namespace ithaca {
namespace spec_internal {
namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// Names other trainers use for our keys; a typo of one of these still finds the right key.
const std::vector<std::pair<std::string, std::string>>& Aliases() {
  static const auto* aliases = new std::vector<std::pair<std::string, std::string>>{
      {"learning_rate", "lr"},
      {"max_steps", "steps"},
      {"warmup", "warmup_steps"},
      {"batch_size", "micro_batch"},
      {"max_grad_norm", "grad_clip"},
      {"gradient_accumulation_steps", "grad_accum"},
      {"context_length", "seq_len"},
      {"seq_length", "seq_len"},
      {"precision", "dtype"},
      {"world_size", "world"},
      {"keep_last", "keep"},
      {"save_every", "every"},
      {"activation_checkpointing", "recompute"},
      {"gradient_checkpointing", "recompute"}};
  return *aliases;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& RenamedKeys() {
  // memory.checkpoint said "checkpoint" for activation recompute while [checkpoint] is the saved
  // training state (docs/schedules.md, "Names").
  static const auto* renamed = new std::vector<std::pair<std::string, std::string>>{
      {"memory.checkpoint", "memory.recompute"},
      {"memory.checkpoint_interval", "memory.recompute_interval"}};
  return *renamed;
}

std::string Suggest(const std::string& bad, const std::string& section,
                    const std::vector<std::string>& valid) {
  std::vector<std::pair<std::string, std::string>> candidates;  // (spelling, valid key)
  for (const std::string& v : valid) candidates.emplace_back(v, v);
  std::vector<std::pair<std::string, std::string>> aliases = Aliases();
  // A renamed key of this section is one more alias of its new name.
  const std::string prefix = section.empty() ? "" : section + ".";
  for (const auto& [old_path, new_path] : RenamedKeys()) {
    if (absl::StartsWith(old_path, prefix) && absl::StartsWith(new_path, prefix)) {
      aliases.emplace_back(old_path.substr(prefix.size()), new_path.substr(prefix.size()));
    }
  }
  for (const auto& [alias, key] : aliases) {
    if (std::find(valid.begin(), valid.end(), key) != valid.end()) {
      candidates.emplace_back(alias, key);
    }
  }
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& [spelling, key] : candidates) {
    size_t d = EditDistance(bad, spelling);
    size_t limit = spelling.size() <= 4 ? 1 : 2;
    bool prefix = bad.size() >= 3 && spelling.compare(0, bad.size(), bad) == 0;
    if ((d <= limit || prefix) && d < best_d) {
      best = key;
      best_d = d;
    }
  }
  return best;
}

}  // namespace spec_internal
}  // namespace ithaca
