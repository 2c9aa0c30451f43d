#include "engine/schedule/recompute_schedule.h"

#include <algorithm>
#include <limits>

namespace ithaca {
namespace {
constexpr int64_t kInfeasible = std::numeric_limits<int64_t>::max() / 4;
}  // namespace

void RecomputeSchedule::Tabulate(int64_t max_n, int64_t max_s) {
  cost_.assign(max_n + 1, std::vector<int64_t>(max_s + 1, kInfeasible));
  split_.assign(max_n + 1, std::vector<int64_t>(max_s + 1, 0));
  for (int64_t s = 0; s <= max_s; ++s) cost_[1][s] = 0;  // the block's own input is held
  for (int64_t n = 2; n <= max_n; ++n) {
    for (int64_t s = 1; s <= max_s; ++s) {  // with no room to hold the next input, none works
      // Run m blocks forward and hold the input reached; backpropagate the n − m blocks from
      // it with one input fewer to spare, free it, then the first m blocks with s again.
      for (int64_t m = 1; m < n; ++m) {
        const int64_t c = m + cost_[n - m][s - 1] + cost_[m][s];
        if (c < cost_[n][s]) {
          cost_[n][s] = c;
          split_[n][s] = m;
        }
      }
    }
  }
}

RecomputeSchedule RecomputeSchedule::Every(int64_t num_blocks, int64_t k) {
  RecomputeSchedule r;
  k = std::clamp<int64_t>(k, 1, std::max<int64_t>(1, num_blocks));
  r.group_of_.resize(num_blocks);
  for (int64_t l = 0; l < num_blocks; ++l) {
    if (l % k == 0) {
      r.starts_.push_back(l);
      r.slots_.push_back(k - 1);  // room for every other input of the group: each regrown once
    }
    r.group_of_[l] = l / k;
  }
  r.Tabulate(k, k - 1);
  return r;
}

RecomputeSchedule RecomputeSchedule::AtMost(int64_t num_blocks, int64_t n) {
  const int64_t L = num_blocks;
  n = std::clamp<int64_t>(n, std::min<int64_t>(2, L), std::max<int64_t>(1, L));
  RecomputeSchedule r;
  r.Tabulate(L, n - 1);
  // The forward saves an input for free: best[len][s] is the fewest forwards for the last len
  // blocks when the first of them is saved and s more may be held; first[len][s] the length of
  // its first group (len: the whole rest is one group).
  std::vector<std::vector<int64_t>> best(L + 1, std::vector<int64_t>(n, kInfeasible));
  std::vector<std::vector<int64_t>> first(L + 1, std::vector<int64_t>(n, 0));
  for (int64_t len = 1; len <= L; ++len) {
    for (int64_t s = 0; s < n; ++s) {
      best[len][s] = r.cost_[len][s];
      first[len][s] = len;
      for (int64_t m = 1; s > 0 && m < len; ++m) {  // a group of m, then save the next input
        const int64_t c = best[len - m][s - 1] + r.cost_[m][s];
        if (c < best[len][s]) {
          best[len][s] = c;
          first[len][s] = m;
        }
      }
    }
  }
  r.group_of_.resize(L);
  for (int64_t a = 0, s = n - 1; a < L; --s) {
    const int64_t m = first[L - a][s];
    r.starts_.push_back(a);
    r.slots_.push_back(s);
    for (int64_t l = a; l < a + m; ++l) r.group_of_[l] = static_cast<int64_t>(r.starts_.size()) - 1;
    a += m;
  }
  return r;
}

RecomputeSchedule::Cost RecomputeSchedule::Simulate() const {
  const int64_t L = num_blocks();
  Cost c;
  std::vector<bool> held(L, false);
  int64_t n_held = 0;
  for (int64_t l = 0; l < L; ++l) {
    if (saved(l)) {
      held[l] = true;
      c.peak_inputs = std::max(c.peak_inputs, ++n_held);
    }
  }
  for (int64_t l = L - 1; l >= 0; --l) {  // as LlamaModel::TakeSaved, then the block's backward
    auto is_held = [&](int64_t j) { return bool(held[j]); };
    while (!held[l]) {
      const Regrowth r = NextRegrowth(l, is_held);
      c.regrow_forwards += r.to - r.from;
      held[r.to] = true;
      c.peak_inputs = std::max(c.peak_inputs, ++n_held);
    }
    held[l] = false;
    --n_held;
  }
  return c;
}

}  // namespace ithaca
