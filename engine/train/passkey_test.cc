// The passkey eval ([eval.passkey]): the scorer against a hand-built model whose answers are known
// (passkey_testing.h: a bigram model made to continue the question into one chosen key), its
// accuracy and log-probability computed on the host from the weights alone. Under parallel layouts:
// passkey_distributed_test.
#include "engine/train/passkey.h"

#include <cmath>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/train/passkey_testing.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

TEST(PasskeyEvalTest, ScoresAHandBuiltModelAsTheHostComputesIt) {
  JobSpec spec;
  spec.data.seq_len = 512;
  spec.eval.passkey.lengths = {200, 512};
  spec.eval.passkey.depths = {0, 0.5, 1};
  spec.eval.passkey.samples = 3;
  spec.training.seed = SeedWithChainableKey(200);
  const BigramModel b = MakeBigramModel(AnswerChain(PasskeyKey(spec.training.seed, 200, 0, 0)));
  ASSERT_GE(b.cfg.vocab_size, static_cast<int64_t>(kByteVocab));

  CpuOps ops;
  HostAllocator alloc;
  LlamaModel::Options opts;
  opts.tile_tokens = 64;
  opts.loss_tile_tokens = 100;  // tiles that split the answers of 512-token prompts
  auto model = LlamaModel::Create(b.cfg, &ops, &alloc, opts);
  ASSERT_TRUE(model.ok()) << model.status();
  for (size_t u = 0; u < b.weights.size(); ++u) {
    ops.Upload(b.weights[u].data(), DType::kF32, (*model)->params().working_shard(u));
  }
  auto eval = PasskeyEval::Create(spec, model->get(), nullptr, 1, 0, MakeByteTokenizer());
  ASSERT_TRUE(eval.ok()) << eval.status();
  auto results = (*eval)->Run();
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 6u);

  std::unique_ptr<TextTokenizer> tok = MakeByteTokenizer();
  int right_somewhere = 0;
  for (size_t li = 0; li < 2; ++li) {
    for (size_t di = 0; di < 3; ++di) {
      const PasskeyResult& r = (*results)[li * 3 + di];
      const int64_t L = spec.eval.passkey.lengths[li];
      EXPECT_EQ(r.length, L);
      EXPECT_EQ(r.depth, spec.eval.passkey.depths[di]);
      EXPECT_EQ(r.samples, 3);
      int right = 0, tokens = 0;
      double logprob = 0;
      for (int64_t k = 0; k < 3; ++k) {
        const std::string kk = PasskeyKey(spec.training.seed, L, static_cast<int64_t>(di), k);
        auto p = BuildPasskeyPrompt(*tok, L, r.depth, kk);
        ASSERT_TRUE(p.ok());
        bool all = true;
        for (int64_t i = p->answer_at; i < L; ++i) {
          auto [hit, lp] = b.Score(p->tokens[i - 1], p->tokens[i]);
          all = all && hit;
          logprob += lp;
          ++tokens;
        }
        right += all;
      }
      right_somewhere += right;
      EXPECT_DOUBLE_EQ(r.accuracy, right / 3.0) << L << " tokens, depth " << r.depth;
      EXPECT_NEAR(r.logprob, logprob / tokens, 1e-4) << L << " tokens, depth " << r.depth;
    }
  }
  // The chosen key (the first of 200 tokens at depth 0) is answered; random keys are not.
  EXPECT_DOUBLE_EQ((*results)[0].accuracy, 1.0 / 3);
  EXPECT_GE(right_somewhere, 1);
  for (const PasskeyResult& r : *results) {
    std::printf("%lld tokens, depth %.2f: accuracy %.3f, logprob %.4f\n",
                static_cast<long long>(r.length), r.depth, r.accuracy, r.logprob);
  }
  EXPECT_GT((*results)[0].logprob, (*results)[1].logprob);
}

// Multi-key retrieval (eval.passkey.keys = [1, 4]) is scored like the passkey: each point is
// what the host computes from the model's weights on the same prompts, the single-key points
// come first, and the model built to answer one sample's asked key retrieves it.
TEST(PasskeyEvalTest, MultiKeyPointsAreScoredLikeThePasskey) {
  JobSpec spec;
  spec.data.seq_len = 512;
  spec.eval.passkey.lengths = {400};
  spec.eval.passkey.depths = {0, 1};
  spec.eval.passkey.samples = 2;
  spec.eval.passkey.keys = {1, 4};
  for (spec.training.seed = 1;; ++spec.training.seed) {
    const std::string key = SamplePasskeyKey(spec.training.seed, 4, 400, 0, 0);
    if (std::set<char>(key.begin(), key.end()).size() == 5) break;
  }
  const std::string asked = SamplePasskeyKey(spec.training.seed, 4, 400, 0, 0);
  const BigramModel b = MakeBigramModel(AnswerChain(asked));
  CpuOps ops;
  HostAllocator alloc;
  LlamaModel::Options opts;
  opts.tile_tokens = 64;
  auto model = LlamaModel::Create(b.cfg, &ops, &alloc, opts);
  ASSERT_TRUE(model.ok()) << model.status();
  for (size_t u = 0; u < b.weights.size(); ++u) {
    ops.Upload(b.weights[u].data(), DType::kF32, (*model)->params().working_shard(u));
  }
  auto eval = PasskeyEval::Create(spec, model->get(), nullptr, 1, 0, MakeByteTokenizer());
  ASSERT_TRUE(eval.ok()) << eval.status();
  auto results = (*eval)->Run();
  ASSERT_TRUE(results.ok()) << results.status();
  const std::vector<PasskeyResult> want = ExpectedResults(b, spec);
  ASSERT_EQ(results->size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const PasskeyResult& r = (*results)[i];
    EXPECT_EQ(r.keys, i < 2 ? 1 : 4) << i;
    EXPECT_EQ(r.keys, want[i].keys);
    EXPECT_EQ(r.length, 400);
    EXPECT_EQ(r.depth, spec.eval.passkey.depths[i % 2]);
    EXPECT_DOUBLE_EQ(r.accuracy, want[i].accuracy) << i;
    EXPECT_NEAR(r.logprob, want[i].logprob, 1e-4) << i;
  }
  EXPECT_GE((*results)[2].accuracy, 0.5) << "sample 0 of 4 keys at depth 0 is answered";
  const std::vector<std::string> lines = FormatPasskeyLines(7, *results);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].rfind("passkey step 7, 400 tokens: accuracy ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("passkey step 7, 400 tokens, 4 keys: accuracy ", 0), 0u) << lines[1];
}

TEST(PasskeyEvalTest, ALengthTooShortForThePromptIsRefused) {
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.eval.passkey.lengths = {64};
  auto cfg = PresetConfig("tiny");
  ASSERT_TRUE(cfg.ok());
  CpuOps ops;
  HostAllocator alloc;
  auto model = LlamaModel::Create(*cfg, &ops, &alloc, LlamaModel::Options());
  ASSERT_TRUE(model.ok());
  auto eval = PasskeyEval::Create(spec, model->get(), nullptr, 1, 0, MakeByteTokenizer());
  ASSERT_FALSE(eval.ok());
  EXPECT_NE(eval.status().message().find("eval.passkey.lengths: 64 tokens cannot hold"),
            std::string::npos)
      << eval.status();
}

}  // namespace
}  // namespace ithaca
