// The recompute schedules (recompute_schedule.h):
// - AtMost's regrowing forwards equal the fewest of any schedule that holds as many inputs,
//   found by an exhaustive search over which inputs the forward saves and where each regrowth
//   stops (a search over held sets, not the schedule's own recursion), and it never holds more;
// - Every(L, k) regrows each unsaved block once, as it always has;
// - the model's loss and gradients are the same under every schedule as with nothing
//   recomputed, and its block-input memory follows the number of inputs held.
#include "engine/schedule/recompute_schedule.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

// The fewest block forwards backward adds for L blocks holding at most n inputs, over every
// schedule: the forward saves any set of inputs with block 0's; backward, at block t, either
// has t's input (its backward frees it) or runs forward from the highest held input below t
// for some m blocks and holds the input reached.
class Exhaustive {
 public:
  Exhaustive(int L, int n) : L_(L), n_(n) {}
  int64_t Best() {
    int64_t best = kNone;
    for (uint32_t saved = 1; saved < (1u << L_); saved += 2) {  // block 0's always
      if (__builtin_popcount(saved) <= n_) best = std::min(best, Backward(saved, L_ - 1));
    }
    return best;
  }

 private:
  static constexpr int64_t kNone = int64_t{1} << 40;
  int64_t Backward(uint32_t held, int t) {
    if (t < 0) return 0;
    const auto key = std::make_pair(held, t);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    int64_t best = kNone;
    if (held >> t & 1) {
      best = Backward(held & ~(1u << t), t - 1);
    } else if (__builtin_popcount(held) < n_) {
      int h = t - 1;
      while (!(held >> h & 1)) --h;
      for (int m = 1; h + m <= t; ++m) {
        best = std::min(best, m + Backward(held | 1u << (h + m), t));
      }
    }
    return memo_[key] = best;
  }
  int L_, n_;
  std::map<std::pair<uint32_t, int>, int64_t> memo_;
};

TEST(RecomputeScheduleTest, AtMostIsAsCheapAsAnyScheduleHoldingAsMany) {
  for (int L = 1; L <= 9; ++L) {
    for (int n = std::min(2, L); n <= L + 1; ++n) {
      const RecomputeSchedule::Cost c = RecomputeSchedule::AtMost(L, n).Simulate();
      EXPECT_EQ(c.regrow_forwards, Exhaustive(L, n).Best()) << "L " << L << " n " << n;
      EXPECT_LE(c.peak_inputs, n) << "L " << L << " n " << n;
    }
  }
  // Every input saved: nothing to regrow.
  EXPECT_EQ(RecomputeSchedule::AtMost(9, 9).Simulate().regrow_forwards, 0);
  EXPECT_EQ(RecomputeSchedule::AtMost(9, 2).Simulate().regrow_forwards, Exhaustive(9, 2).Best());
}

TEST(RecomputeScheduleTest, EveryRegrowsEachUnsavedBlockOnce) {
  for (int L : {1, 5, 16, 32}) {
    for (int k = 1; k <= L; ++k) {
      const RecomputeSchedule r = RecomputeSchedule::Every(L, k);
      const RecomputeSchedule::Cost c = r.Simulate();
      int64_t saved = 0;
      for (int l = 0; l < L; ++l) {
        EXPECT_EQ(r.saved(l), l % k == 0);
        saved += r.saved(l);
      }
      EXPECT_EQ(c.regrow_forwards, L - saved) << "L " << L << " k " << k;
      // The most held: while backward is in the group before the last full one... every saved
      // input up to and including a group's, and that group's others.
      int64_t peak = 0;
      for (int64_t a = 0; a < L; a += k) peak = std::max(peak, a / k + std::min<int64_t>(k, L - a));
      EXPECT_EQ(c.peak_inputs, peak) << "L " << L << " k " << k;
    }
  }
}

// Llama-3-8B's 32 blocks, the figures recompute_schedule.h quotes.
TEST(RecomputeScheduleTest, ThirtyTwoBlocks) {
  const RecomputeSchedule::Cost every6 = RecomputeSchedule::Every(32, 6).Simulate();
  EXPECT_EQ(every6.peak_inputs, 10);
  EXPECT_EQ(every6.regrow_forwards, 26);
  std::vector<int64_t> forwards;
  for (int n = 2; n <= 12; ++n) {
    const RecomputeSchedule::Cost c = RecomputeSchedule::AtMost(32, n).Simulate();
    EXPECT_LE(c.peak_inputs, n);
    if (!forwards.empty()) {
      EXPECT_LE(c.regrow_forwards, forwards.back()) << n;
    }
    forwards.push_back(c.regrow_forwards);
  }
  EXPECT_EQ(forwards[10 - 2], 22);
  EXPECT_EQ(forwards[6 - 2], 37);
}

struct Result {
  double loss_sum = 0;
  std::vector<std::vector<float>> grads;
  int64_t block_input_peak = 0;  // bytes
};

Result RunStep(const LlamaModel::Options& o, const LlamaConfig& cfg, int64_t S) {
  CpuOps ops;
  HostAllocator alloc;
  Result r;
  auto m = LlamaModel::Create(cfg, &ops, &alloc, o);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return r;
  for (int u = 0; u < (*m)->layout().num_units(); ++u) {
    const std::vector<float> w = RandomUnitWeights((*m)->layout(), u, 11);
    ops.Upload(w.data(), DType::kF32, (*m)->params().working_shard(u));
  }
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(S + 1);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % cfg.vocab_size);
  ParamStore& ps = (*m)->params();
  ps.ZeroGrads();
  alloc.tracker().ResetPeaks();
  auto l = (*m)->ForwardBackward(tokens.data(), tokens.data() + 1, S, 0.01f);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return r;
  r.loss_sum = l->loss_sum;
  r.block_input_peak = alloc.tracker().peak(Tier::kBlockInputs);
  EXPECT_TRUE(ps.FinishGradients().ok());
  for (int u = 0; u < ps.num_units(); ++u) {
    auto g = ps.GatherToHost(u, ps.grad_shard(u));
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) r.grads.push_back(std::move(*g));
  }
  return r;
}

TEST(RecomputeScheduleTest, TheModelIsTheSameUnderEverySchedule) {
  LlamaConfig cfg = *PresetConfig("tiny");
  cfg.num_hidden_layers = 7;
  const int64_t S = 24, input_bytes = S * cfg.hidden_size * 4;
  // Against nothing recomputed with the same head stages (stages sum in another order).
  std::map<int64_t, Result> want_of;
  for (int64_t chunk : {0, 2}) {
    LlamaModel::Options none;
    none.recompute = RecomputePolicy::kNone;
    none.head_chunk = chunk;
    want_of[chunk] = RunStep(none, cfg, S);
    ASSERT_EQ(want_of[chunk].grads.size(), static_cast<size_t>(cfg.num_hidden_layers + 2));
  }

  struct Case {
    std::string name;
    RecomputePolicy policy;
    int64_t interval, at_most;
    bool offload;
    int64_t head_chunk;
    int64_t aware_blocks = -1;  // attention-aware on the last N blocks (a mix); -1: all
  };
  std::vector<Case> cases = {
      {"every1", RecomputePolicy::kFull, 1, 0, false, 0},
      {"every3", RecomputePolicy::kFull, 3, 0, false, 2},
      {"every3_aware", RecomputePolicy::kAttentionAware, 3, 0, false, 0},
      {"at_most2_offload", RecomputePolicy::kFull, 1, 2, true, 0},
      {"at_most3_aware", RecomputePolicy::kAttentionAware, 1, 3, false, 0},
      {"at_most3_aware_offload", RecomputePolicy::kAttentionAware, 1, 3, true, 2},
      // Per-block mixes: attention-aware on the last N blocks, full on
      // the others.
      {"mix0", RecomputePolicy::kAttentionAware, 1, 0, false, 0, 0},
      {"mix3", RecomputePolicy::kAttentionAware, 1, 0, false, 0, 3},
      {"mix4_offload", RecomputePolicy::kAttentionAware, 1, 0, true, 2, 4},
      {"mix2_every3", RecomputePolicy::kAttentionAware, 3, 0, false, 0, 2},
      {"mix5_at_most3", RecomputePolicy::kAttentionAware, 1, 3, false, 2, 5},
      {"aware_all", RecomputePolicy::kAttentionAware, 1, 0, false, 0}};
  for (int64_t n = 2; n <= 8; ++n) {
    cases.push_back({"at_most" + std::to_string(n), RecomputePolicy::kFull, 1, n, false, 0});
  }
  std::map<int64_t, int64_t> peak_of;  // at_most n (on the device, full recompute) -> bytes
  std::map<std::string, int64_t> block_inputs_of;  // case -> block_inputs peak
  for (const Case& c : cases) {
    LlamaModel::Options o;
    o.recompute = c.policy;
    o.recompute_interval = c.interval;
    o.saved_block_inputs = c.at_most;
    o.offload = c.offload;
    o.head_chunk = c.head_chunk;
    o.attention_aware_blocks = c.aware_blocks;
    const Result got = RunStep(o, cfg, S);
    block_inputs_of[c.name] = got.block_input_peak;
    const Result& want = want_of[c.head_chunk];
    EXPECT_EQ(got.loss_sum, want.loss_sum) << c.name;
    ASSERT_EQ(got.grads.size(), want.grads.size()) << c.name;
    for (size_t u = 0; u < want.grads.size(); ++u) {
      EXPECT_EQ(got.grads[u], want.grads[u]) << c.name << ": unit " << u;
    }
    if (c.at_most > 0 && !c.offload && c.policy == RecomputePolicy::kFull) {
      // The inputs held, and the output of the block running (the forward's, or a regrowth's).
      EXPECT_LE(got.block_input_peak, (c.at_most + 1) * input_bytes) << c.name;
      peak_of[c.at_most] = got.block_input_peak;
    }
  }
  EXPECT_LT(peak_of[2], peak_of[4]);
  EXPECT_LT(peak_of[4], peak_of[7]);
  // A mix keeps O and LSE on its attention-aware blocks only: between full and every block.
  EXPECT_EQ(block_inputs_of["mix0"], block_inputs_of["every1"]);
  EXPECT_LT(block_inputs_of["every1"], block_inputs_of["mix3"]);
  EXPECT_LT(block_inputs_of["mix3"], block_inputs_of["aware_all"]);
}

}  // namespace
}  // namespace ithaca
