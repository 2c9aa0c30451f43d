// Evaluation over two Gloo ranks (processes) agrees with one rank: a Ulysses pair (each rank
// half of every window) and an FSDP data-parallel pair (each replica its own windows). Every
// layout runs in forked processes, the one-rank reference too: this test process never runs the
// OpenMP CPU kernels itself, so forking stays safe.
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/plan/resolve.h"
#include "engine/train/eval_rank_testing.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

std::string WriteCorpus(const std::string& dir) {
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  const std::vector<uint32_t> tokens = ByteTokenize(text.ok() ? *text : "");
  const std::string path = dir + "/corpus.tok";
  EXPECT_TRUE(WriteTokenFileV2(path, tokens, ByteTokenMeta(tokens)).ok());
  return path;
}

struct Layout {
  int world = 1, sp = 1;
  bool fsdp = false;
  int64_t batches = 2;
};

absl::Status EvaluateOnRank(int rank, const Layout& layout, const std::string& corpus,
                            const std::string& rendezvous, const std::string& out) {
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.seq_len = 64;
  spec.training.steps = 0;
  spec.training.lr = 0;
  spec.training.min_lr = 0;
  spec.memory.tile_tokens = 16;
  spec.memory.recompute = RecomputePolicy::kFull;
  spec.parallel.world = layout.world;
  spec.parallel.sp = layout.sp;
  spec.parallel.fsdp = layout.fsdp;
  spec.eval.path = corpus;
  spec.eval.batches = layout.batches;
  spec.eval.position_buckets = {16, 40};
  ASSIGN_OR_RETURN(const std::vector<EvalReport> evals,
                   testing::EvaluateRank(spec, rank, rendezvous));
  RANK_CHECK(evals.size() == 1u, evals.size());
  if (rank == 0) {
    std::string text =
        absl::StrFormat("%.17g %d", evals[0].loss, static_cast<int>(evals[0].tokens));
    for (const PositionLoss& b : evals[0].positions) {
      absl::StrAppendFormat(&text, " %.17g %d", b.loss, static_cast<int>(b.tokens));
    }
    RETURN_IF_ERROR(WriteFileAtomic(out, text));
  }
  return absl::OkStatus();
}

// The loss and its tokens, then each position bucket's ([0, 16), [16, 40), [40, 64)).
std::vector<std::pair<double, int64_t>> EvaluateLayout(const Layout& layout) {
  testing::TempDir dir;
  const std::string corpus = WriteCorpus(dir.path());
  const std::string out = dir.path() + "/result.txt";
  testing::RunOptions opts;
  opts.wall_limit_s = 120;
  const auto outcomes = testing::RunRanks(
      layout.world,
      [&](int rank) { return EvaluateOnRank(rank, layout, corpus, dir.rendezvous(), out); }, opts);
  EXPECT_EQ(testing::Failures(outcomes), "");
  std::ifstream in(out);
  std::vector<std::pair<double, int64_t>> v;
  double loss = -1;
  int64_t tokens = -1;
  while (in >> loss >> tokens) v.push_back({loss, tokens});
  EXPECT_EQ(v.size(), 4u);
  v.resize(4, {-1.0, -1});
  return v;
}

// The same numbers, the loss and each bucket's.
void ExpectSame(const std::vector<std::pair<double, int64_t>>& a,
                const std::vector<std::pair<double, int64_t>>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].second, b[i].second) << i;
    EXPECT_NEAR(a[i].first, b[i].first, 1e-5 * b[i].first) << i;
  }
}

// The loss, and its split by position (eval.position_buckets), under Ulysses and FSDP.
TEST(EvaluatorDistributedTest, TwoRanksAgreeWithOne) {
  const auto one = EvaluateLayout({1, 1, false, 2});
  EXPECT_EQ(one[0].second, 2 * 64);
  EXPECT_GT(one[0].first, 1);
  EXPECT_EQ(one[1].second, 2 * 16);
  EXPECT_EQ(one[2].second, 2 * 24);
  EXPECT_EQ(one[3].second, 2 * 24);
  ExpectSame(EvaluateLayout({2, 2, true, 2}), one);

  // Data parallel: each of 2 replicas takes one batch of its own windows; one rank takes both.
  ExpectSame(EvaluateLayout({2, 1, true, 1}), one);
}

}  // namespace
}  // namespace ithaca
