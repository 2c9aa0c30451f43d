// Packed documents and loss masks on one rank, against exact oracles:
// - a packed sample with document masking equals each of its documents run on its own (loss sum
//   and every gradient), under every recompute policy, UPipe head chunks, offload and tiling
//   (tests/parallel checks the same across ranks);
// - loss masks: the gradient of all labels is the gradient of the masked labels plus that of
//   the others, so a masked label adds nothing to the gradient.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/model/weights.h"
#include "engine/schedule/llama.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

LlamaConfig TinyConfig() {
  LlamaConfig cfg = *PresetConfig("tiny");
  cfg.num_hidden_layers = 3;
  return cfg;
}

struct Result {
  double loss_sum = 0;
  int64_t tokens = 0;
  std::vector<std::vector<float>> grads;  // per unit, gathered
};

class PackedTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<LlamaModel>> Model(const LlamaModel::Options& o) {
    ASSIGN_OR_RETURN(auto m, LlamaModel::Create(cfg_, &ops_, &alloc_, o));
    for (int u = 0; u < m->layout().num_units(); ++u) {
      const std::vector<float> w = RandomUnitWeights(m->layout(), u, 7);
      ops_.Upload(w.data(), DType::kF32, m->params().working_shard(u));
    }
    return m;
  }

  // Runs each (inputs, labels, docs) sample's forward and backward, accumulating gradients.
  struct Sample {
    std::vector<int32_t> inputs, labels;
    DocumentMask docs;
  };
  Result Run(const LlamaModel::Options& o, const std::vector<Sample>& samples) {
    auto m = Model(o);
    EXPECT_TRUE(m.ok()) << m.status();
    Result r;
    if (!m.ok()) return r;
    ParamStore& ps = (*m)->params();
    ps.ZeroGrads();
    for (const Sample& s : samples) {
      auto l = (*m)->ForwardBackward(s.inputs.data(), s.labels.data(),
                                     static_cast<int64_t>(s.inputs.size()), 0.01f, s.docs);
      EXPECT_TRUE(l.ok()) << l.status();
      if (!l.ok()) return r;
      r.loss_sum += l->loss_sum;
      r.tokens += l->tokens;
    }
    EXPECT_TRUE(ps.FinishGradients().ok());
    for (int u = 0; u < ps.num_units(); ++u) {
      auto g = ps.GatherToHost(u, ps.grad_shard(u));
      EXPECT_TRUE(g.ok()) << g.status();
      if (g.ok()) r.grads.push_back(std::move(*g));
    }
    return r;
  }

  static void ExpectSame(const Result& got, const Result& want, const std::string& what) {
    EXPECT_EQ(got.tokens, want.tokens) << what;
    EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-5 * std::abs(want.loss_sum) + 1e-5) << what;
    ASSERT_EQ(got.grads.size(), want.grads.size()) << what;
    for (size_t u = 0; u < want.grads.size(); ++u) {
      ASSERT_EQ(got.grads[u].size(), want.grads[u].size());
      double scale = 0, err = 0;
      for (size_t i = 0; i < want.grads[u].size(); ++i) {
        scale = std::max(scale, std::abs(double(want.grads[u][i])));
        err = std::max(err, std::abs(double(got.grads[u][i]) - want.grads[u][i]));
      }
      EXPECT_GT(scale, 0) << what << ": unit " << u << " has no gradient";
      EXPECT_LE(err, 1e-7 + 2e-4 * scale) << what << ": unit " << u << " max|want| " << scale;
    }
  }

  std::vector<int32_t> RandomTokens(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % cfg_.vocab_size);
    return t;
  }

  LlamaConfig cfg_ = TinyConfig();
  CpuOps ops_{cpu::AttentionBlocks{8, 8}};  // small blocks: documents cross block boundaries
  HostAllocator alloc_;
};

TEST_F(PackedTest, PackedSampleEqualsEachDocumentAlone) {
  // Documents of 5, 1, 23 and 19 tokens; the window's last token continues past it (its label
  // is the next token of the same document) while every other document's last label is cut.
  const int64_t S = 48;
  const std::vector<int64_t> starts = {0, 5, 6, 29};
  const std::vector<int32_t> tokens = RandomTokens(S + 1, 3);
  Sample packed{std::vector<int32_t>(tokens.begin(), tokens.begin() + S),
                std::vector<int32_t>(tokens.begin() + 1, tokens.end()), DocumentMask{starts}};
  std::vector<Sample> alone;
  for (size_t d = 0; d < starts.size(); ++d) {
    const int64_t a = starts[d], b = d + 1 < starts.size() ? starts[d + 1] : S;
    if (d + 1 < starts.size()) packed.labels[b - 1] = -1;
    Sample s{std::vector<int32_t>(tokens.begin() + a, tokens.begin() + b),
             std::vector<int32_t>(tokens.begin() + a + 1, tokens.begin() + b + 1),
             {}};
    if (d + 1 < starts.size()) s.labels.back() = -1;
    alone.push_back(std::move(s));
  }
  const Result want = Run(LlamaModel::Options(), alone);
  EXPECT_EQ(want.tokens, S - 3);

  struct Case {
    const char* name;
    RecomputePolicy policy;
    int64_t head_chunk, tile, loss_tile, interval;
    bool offload;
  };
  for (const Case& c :
       {Case{"none", RecomputePolicy::kNone, 0, 0, 0, 1, false},
        Case{"full_chunk2_tiled", RecomputePolicy::kFull, 2, 8, 16, 1, false},
        Case{"aware_interval2_offload", RecomputePolicy::kAttentionAware, 0, 0, 0, 2, true},
        Case{"full_chunk2_interval3_offload", RecomputePolicy::kFull, 2, 16, 7, 3, true}}) {
    LlamaModel::Options o;
    o.recompute = c.policy;
    o.head_chunk = c.head_chunk;
    o.tile_tokens = c.tile;
    o.loss_tile_tokens = c.loss_tile;
    o.recompute_interval = c.interval;
    o.offload = c.offload;
    ExpectSame(Run(o, {packed}), want, c.name);
  }
  // And the mask matters: without it the same tokens give another gradient.
  Sample unmasked = packed;
  unmasked.docs = {};
  const Result plain = Run(LlamaModel::Options(), {unmasked});
  EXPECT_GT(std::abs(plain.loss_sum - want.loss_sum), 1e-3);
}

TEST_F(PackedTest, MaskedLabelsAddNoGradient) {
  const int64_t S = 32;
  const std::vector<int32_t> tokens = RandomTokens(S + 1, 5);
  Sample all{std::vector<int32_t>(tokens.begin(), tokens.begin() + S),
             std::vector<int32_t>(tokens.begin() + 1, tokens.end()), DocumentMask{{0, 12}}};
  Sample prompt = all, completion = all;
  for (int64_t i = 0; i < S; ++i) {
    const bool in_completion = (i >= 4 && i < 11) || i >= 20;
    (in_completion ? prompt : completion).labels[i] = -1;
  }
  LlamaModel::Options o;
  o.head_chunk = 2;
  const Result whole = Run(o, {all});
  const Result parts = Run(o, {prompt, completion});  // gradients accumulate over the two
  ExpectSame(parts, whole, "prompt + completion");
  const Result only = Run(o, {completion});
  EXPECT_EQ(only.tokens, 7 + 12);
  EXPECT_GT(std::abs(only.loss_sum - whole.loss_sum), 1e-3);
}

// The loss head's default tile: about 2^28 logits in whole 128-row GEMM tiles, never more than the
// sequence, never fewer than one GEMM tile (a vocabulary too large for 128 rows still gets them).
TEST(DefaultLossTileTokensTest, AboutTwoToThe28LogitsInWholeGemmTiles) {
  EXPECT_EQ(DefaultLossTileTokens(131072, 128256), 2048);  // Llama 3: 2048·128256 ≈ 2^28
  EXPECT_EQ(DefaultLossTileTokens(131072, 151936), 1664);  // Qwen: ⌊1766.8 / 128⌋·128
  EXPECT_EQ(DefaultLossTileTokens(1000, 128256), 1000);    // the whole sequence
  EXPECT_EQ(DefaultLossTileTokens(1 << 20, int64_t{1} << 22), 128);
  EXPECT_EQ(DefaultLossTileTokens(96, 256), 96);
  for (int64_t v : {1000, 32000, 128256, 151936}) {
    const int64_t t = DefaultLossTileTokens(int64_t{1} << 24, v);
    EXPECT_EQ(t % 128, 0) << v;
    EXPECT_LE(t * v, int64_t{1} << 28) << v;
    EXPECT_GT((t + 128) * v, int64_t{1} << 28) << v;
  }
}

}  // namespace
}  // namespace ithaca
