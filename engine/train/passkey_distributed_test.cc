// The passkey eval over Gloo ranks (processes) agrees with one rank: a Ulysses pair (each rank
// half of every prompt, the answer on the second), an FSDP data-parallel pair (each replica its
// own samples, 3 of them, so one replica runs a padding forward), and a Ulysses pair with one
// UPipe head per stage. It runs as a job does: an evaluation-only job's Trainer, with the
// hand-built model of passkey_testing.h loaded from model.weights, so some answers are right.
// Every layout runs in forked processes, the one-rank reference too (this process never runs
// the OpenMP CPU kernels itself, so forking stays safe).
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/comm/bootstrap.h"
#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/plan/resolve.h"
#include "engine/train/passkey_testing.h"
#include "engine/train/eval_rank_testing.h"
#include "engine/train/trainer.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

struct Layout {
  int world = 1, sp = 1;
  bool fsdp = false;
  int head_chunk = 0;  // 0: "auto"
};

JobSpec PasskeySpec(const std::string& model_dir, const Layout& layout) {
  JobSpec spec;
  spec.model.config = model_dir + "/config.json";
  spec.model.weights = model_dir;
  spec.data.seq_len = 256;
  spec.training.steps = 0;
  spec.training.lr = 0;
  spec.training.min_lr = 0;
  spec.training.seed = SeedWithChainableKey(128);
  spec.memory.tile_tokens = 32;
  spec.memory.head_chunk = layout.head_chunk;
  spec.parallel.world = layout.world;
  spec.parallel.sp = layout.sp;
  spec.parallel.fsdp = layout.fsdp;
  spec.eval.passkey.lengths = {128, 256};
  spec.eval.passkey.depths = {0, 0.5, 1};
  spec.eval.passkey.samples = 3;
  return spec;
}

absl::Status EvaluateOnRank(int rank, const Layout& layout, const std::string& model_dir,
                            const std::string& rendezvous, const std::string& out) {
  const JobSpec spec = PasskeySpec(model_dir, layout);
  ASSIGN_OR_RETURN(const std::vector<EvalReport> evals,
                   testing::EvaluateRank(spec, rank, rendezvous));
  RANK_CHECK(evals.size() == 1u, evals.size());
  RANK_CHECK(evals[0].tokens == 0, evals[0].tokens);  // no eval.path: no held-out loss
  if (rank == 0) {
    std::string text;
    for (const PasskeyResult& r : evals[0].passkey) {
      absl::StrAppend(&text, absl::StrFormat("%d %.17g %d %.17g %.17g\n", r.length, r.depth,
                                             r.samples, r.accuracy, r.logprob));
    }
    RETURN_IF_ERROR(WriteFileAtomic(out, text));
  }
  return absl::OkStatus();
}

std::vector<PasskeyResult> EvaluateLayout(const std::string& model_dir, const Layout& layout) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/result.txt";
  testing::RunOptions opts;
  opts.wall_limit_s = 120;
  const auto outcomes = testing::RunRanks(
      layout.world,
      [&](int rank) { return EvaluateOnRank(rank, layout, model_dir, dir.rendezvous(), out); },
      opts);
  EXPECT_EQ(testing::Failures(outcomes), "");
  std::ifstream in(out);
  std::vector<PasskeyResult> results;
  PasskeyResult r;
  while (in >> r.length >> r.depth >> r.samples >> r.accuracy >> r.logprob) results.push_back(r);
  return results;
}

TEST(PasskeyDistributedTest, ParallelLayoutsAgreeWithOneRank) {
  testing::TempDir dir;
  const uint64_t seed = SeedWithChainableKey(128);
  const BigramModel b = MakeBigramModel(AnswerChain(PasskeyKey(seed, 128, 0, 0)));
  const ParamLayout params(b.cfg);
  std::vector<const float*> units;
  for (const std::vector<float>& u : b.weights) units.push_back(u.data());
  const std::string model_dir = dir.path() + "/model";
  ASSERT_TRUE(
      WriteHfCheckpoint(model_dir, b.cfg, params, units, DType::kF32, int64_t{1} << 40).ok());

  const std::vector<PasskeyResult> one = EvaluateLayout(model_dir, {1, 1, false, 0});
  ASSERT_EQ(one.size(), 6u);
  EXPECT_DOUBLE_EQ(one[0].accuracy, 1.0 / 3) << "the chosen key is retrieved";
  const std::vector<PasskeyResult> want = ExpectedResults(b, PasskeySpec(model_dir, {}));
  ASSERT_EQ(want.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].accuracy, want[i].accuracy) << i;
    EXPECT_NEAR(one[i].logprob, want[i].logprob, 1e-4) << i;
  }
  for (const Layout& layout :
       {Layout{2, 2, true, 0}, Layout{2, 1, true, 0}, Layout{2, 2, false, 2}}) {
    SCOPED_TRACE(absl::StrCat("world ", layout.world, " sp ", layout.sp, " fsdp ", layout.fsdp,
                              " head_chunk ", layout.head_chunk));
    const std::vector<PasskeyResult> got = EvaluateLayout(model_dir, layout);
    ASSERT_EQ(got.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_EQ(got[i].length, one[i].length);
      EXPECT_EQ(got[i].depth, one[i].depth);
      EXPECT_EQ(got[i].accuracy, one[i].accuracy) << i;
      EXPECT_NEAR(got[i].logprob, one[i].logprob, 1e-5 * std::abs(one[i].logprob)) << i;
    }
  }
}

}  // namespace
}  // namespace ithaca
