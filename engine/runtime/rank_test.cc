// Rank set-up on the CPU: a rank alone trains without a communicator; ranks started together
// join one and train as one job (Ulysses over two ranks gives the single rank's losses); the
// spec's world and backend are checked. Training runs in forked rank processes only, so this
// test process never starts OpenMP threads before it forks.
#include "engine/runtime/rank.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "engine/comm/testing/multiprocess.h"
#include "engine/core/file_util.h"
#include "engine/data/byte_tokenizer.h"
#include "engine/data/token_file.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

JobSpec TinySpec(const std::string& dir) {
  auto text = ReadFileToString("engine/data/testdata/tiny_corpus.txt");
  EXPECT_TRUE(text.ok()) << text.status();
  JobSpec spec;
  spec.model.preset = "tiny";
  spec.data.path = dir + "/corpus.tok";
  EXPECT_TRUE(WriteTokenFile(spec.data.path, ByteTokenize(*text), kByteVocab).ok());
  spec.data.seq_len = 64;
  spec.training.steps = 3;
  spec.training.warmup_steps = 1;
  spec.memory.tile_tokens = 16;
  return spec;
}

// Trains `spec` as rank `rank` of `world` and writes its step losses to `out`.
absl::Status TrainRank(JobSpec spec, int rank, int world, const std::string& rendezvous,
                       const std::string& out) {
  RankInfo info;
  info.rank = rank;
  info.world = world;
  info.rendezvous = rendezvous;
  RankOptions options;
  options.comm_timeout_s = 60;
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, Rank::Create(spec, info, options));
  if (world == 1) {
    RANK_CHECK(r->comm() == nullptr, "a rank alone has no communicator");
  } else {
    RANK_CHECK(r->comm() != nullptr && r->comm()->size() == world && r->comm()->rank() == rank);
  }
  RANK_CHECK(r->spec().memory.host_budget_gib > 0, "the host budget is the machine's share");
  RANK_CHECK(r->ops().device() == Device::kCpu);
  std::ofstream f(out);
  RETURN_IF_ERROR(r->trainer().Run([&](const StepReport& s) { f << s.loss << "\n"; }));
  return absl::OkStatus();
}

std::vector<double> ReadLosses(const std::string& path) {
  std::ifstream f(path);
  std::vector<double> v;
  for (double x; f >> x;) v.push_back(x);
  return v;
}

TEST(RankTest, UlyssesRanksTrainLikeOneRank) {
  testing::TempDir dir;
  JobSpec spec = TinySpec(dir.path());
  testing::RunOptions run;
  run.wall_limit_s = 120;
  auto alone = testing::RunRanks(
      1, [&](int) { return TrainRank(spec, 0, 1, "", dir.path() + "/alone"); }, run);
  ASSERT_EQ(testing::Failures(alone), "");

  spec.parallel.world = 2;
  spec.parallel.sp = 2;
  const std::string rendezvous = dir.rendezvous();
  auto pair = testing::RunRanks(
      2,
      [&](int rank) {
        return TrainRank(spec, rank, 2, rendezvous, absl::StrCat(dir.path(), "/sp", rank));
      },
      run);
  ASSERT_EQ(testing::Failures(pair), "");

  const std::vector<double> want = ReadLosses(dir.path() + "/alone");
  ASSERT_EQ(want.size(), 3u);
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<double> got = ReadLosses(absl::StrCat(dir.path(), "/sp", rank));
    ASSERT_EQ(got.size(), want.size()) << "rank " << rank;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-3 * want[i]) << "rank " << rank << ", step " << i + 1;
    }
  }
}

TEST(RankTest, TheSpecMustAskForTheRanksStarted) {
  testing::TempDir dir;
  JobSpec spec = TinySpec(dir.path());
  spec.parallel.world = 2;
  RankInfo alone;
  auto r = Rank::Create(spec, alone);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "parallel.world")) << r.status();
}

TEST(RankTest, UnknownBackendIsNamed) {
  testing::TempDir dir;
  JobSpec spec = TinySpec(dir.path());
  spec.backend = "tpu";
  auto r = Rank::Create(spec, RankInfo());
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "\"tpu\"")) << r.status();
}

// A spec that is not resolved yet (standalone, a test) is resolved before the rank's backend is
// made, so the backend is made from what a daemon job would run (the kernels, the GPU budget).
TEST(RankTest, TheBackendIsMadeFromTheResolvedSpec) {
  testing::TempDir dir;
  JobSpec spec = TinySpec(dir.path());
  ASSERT_FALSE(CheckResolved(spec).ok()) << "the test needs a spec with \"auto\" left";
  std::optional<JobSpec> seen;
  RankOptions options;
  options.make_backend = [&](const JobSpec& s, int gpu) {
    seen = s;
    return MakeBackend(s, gpu);
  };
  auto r = Rank::Create(spec, RankInfo(), options);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(CheckResolved(*seen).ok()) << CheckResolved(*seen);
  EXPECT_EQ(JobSpecToToml(*seen), JobSpecToToml((*r)->spec()));
}

// A standalone job over 2 nodes of 8 ranks: each rank shares its host with the node's 8 ranks,
// not with all 16 (the host budget was divided by the whole world).
TEST(RankNodeTest, TheHostIsSharedByTheNodesRanksOnly) {
  RankInfo info;
  info.world = 16;
  info.local_world = 8;
  EXPECT_EQ(RankNode(info, 0).ranks_on_host, 8);
  JobSpec spec;
  const int64_t per_rank = BudgetsFor(spec, RankNode(info, 0)).host_bytes;
  info.local_world = 0;  // one host: all of the job's ranks
  EXPECT_EQ(RankNode(info, 0).ranks_on_host, 16);
  EXPECT_NEAR(double(BudgetsFor(spec, RankNode(info, 0)).host_bytes) * 2, double(per_rank), 16.0);
}

TEST(RankInfoOrAloneTest, EnvironmentOrRankZeroOfOne) {
  unsetenv(kEnvRank);
  auto alone = RankInfoOrAlone();
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->rank, 0);
  EXPECT_EQ(alone->world, 1);

  setenv(kEnvRank, "1", 1);
  setenv(kEnvWorldSize, "3", 1);
  setenv(kEnvRendezvous, "file:/tmp/x", 1);
  auto launched = RankInfoOrAlone();
  ASSERT_TRUE(launched.ok()) << launched.status();
  EXPECT_EQ(launched->rank, 1);
  EXPECT_EQ(launched->world, 3);

  setenv(kEnvRank, "5", 1);  // outside the world: an error, not "alone"
  EXPECT_EQ(RankInfoOrAlone().status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* k : {kEnvRank, kEnvWorldSize, kEnvRendezvous}) unsetenv(k);
}

}  // namespace
}  // namespace ithaca
