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
  ASSIGN_OR_RETURN(const std::vector<EvalReport> evals,
                   testing::EvaluateRank(spec, rank, rendezvous));
  RANK_CHECK(evals.size() == 1u, evals.size());
  if (rank == 0) {
    RETURN_IF_ERROR(WriteFileAtomic(
        out, absl::StrFormat("%.17g %d", evals[0].loss, static_cast<int>(evals[0].tokens))));
  }
  return absl::OkStatus();
}

std::pair<double, int64_t> EvaluateLayout(const Layout& layout) {
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
  double loss = -1;
  int64_t tokens = -1;
  in >> loss >> tokens;
  return {loss, tokens};
}

TEST(EvaluatorDistributedTest, TwoRanksAgreeWithOne) {
  const auto one = EvaluateLayout({1, 1, false, 2});
  EXPECT_EQ(one.second, 2 * 64);
  EXPECT_GT(one.first, 1);
  const auto ulysses = EvaluateLayout({2, 2, true, 2});
  EXPECT_EQ(ulysses.second, one.second);
  EXPECT_NEAR(ulysses.first, one.first, 1e-5 * one.first);

  // Data parallel: each of 2 replicas takes one batch of its own windows; one rank takes both.
  const auto fsdp = EvaluateLayout({2, 1, true, 1});
  EXPECT_EQ(fsdp.second, one.second);
  EXPECT_NEAR(fsdp.first, one.first, 1e-5 * one.first);
}

}  // namespace
}  // namespace ithaca
