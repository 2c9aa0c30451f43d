// Bootstrap: the ITHACA_* environment contract and ConnectComm's choice of backend, including a
// real two-process Gloo connection.
#include "engine/comm/bootstrap.h"

#include <cstdlib>

#include "absl/strings/match.h"
#include "engine/comm/testing/multiprocess.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    for (const char* v : {kEnvRank, kEnvWorldSize, kEnvRendezvous, kEnvGpu, kEnvGlooHost,
                          kEnvGlooIssueDelay, kEnvLocalWorldSize}) {
      unsetenv(v);
    }
  }
  static void Set(const char* rank, const char* world, const char* rdzv, const char* gpu) {
    Clear();
    if (rank) setenv(kEnvRank, rank, 1);
    if (world) setenv(kEnvWorldSize, world, 1);
    if (rdzv) setenv(kEnvRendezvous, rdzv, 1);
    if (gpu) setenv(kEnvGpu, gpu, 1);
  }
  static void ExpectInvalid(const char* mentions) {
    auto info = RankInfoFromEnvironment();
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << info.status();
    EXPECT_TRUE(absl::StrContains(info.status().message(), mentions)) << info.status();
  }
};

TEST_F(EnvTest, NotLaunchedAsARank) {
  EXPECT_EQ(RankInfoFromEnvironment().status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EnvTest, ReadsEveryVariable) {
  Set("2", "4", "file:/tmp/x", "3");
  setenv(kEnvGlooHost, "10.0.0.7", 1);
  setenv(kEnvGlooIssueDelay, "5", 1);
  auto info = RankInfoFromEnvironment();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->rank, 2);
  EXPECT_EQ(info->world, 4);
  EXPECT_EQ(info->gpu, 3);
  EXPECT_EQ(info->rendezvous, "file:/tmp/x");
  EXPECT_EQ(info->gloo_host, "10.0.0.7");
  EXPECT_EQ(info->gloo_issue_delay_ms, 5);
  EXPECT_EQ(info->local_world, 0);  // unset: one host
  setenv(kEnvLocalWorldSize, "2", 1);
  info = RankInfoFromEnvironment();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->local_world, 2);
  setenv(kEnvLocalWorldSize, "5", 1);
  EXPECT_FALSE(RankInfoFromEnvironment().ok());  // more ranks on the host than in the job
  unsetenv(kEnvLocalWorldSize);
  Set("0", "1", nullptr, nullptr);
  info = RankInfoFromEnvironment();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->gpu, -1);
  EXPECT_EQ(info->gloo_issue_delay_ms, 0);
  EXPECT_EQ(info->gloo_host, "127.0.0.1");
}

TEST_F(EnvTest, BadValuesAreNamed) {
  Set("1", nullptr, "file:/tmp/x", nullptr);
  ExpectInvalid("ITHACA_WORLD_SIZE is not set");
  Set("one", "2", "file:/tmp/x", nullptr);
  ExpectInvalid("ITHACA_RANK=\"one\"");
  Set("-1", "2", "file:/tmp/x", nullptr);
  ExpectInvalid("ITHACA_RANK");
  Set("2", "2", "file:/tmp/x", nullptr);
  ExpectInvalid("is not below ITHACA_WORLD_SIZE=2");
  Set("0", "0", "file:/tmp/x", nullptr);
  ExpectInvalid("ITHACA_WORLD_SIZE=\"0\"");
  Set("0", "2", nullptr, nullptr);
  ExpectInvalid("ITHACA_RENDEZVOUS is not set");
  Set("0", "2", "file:/tmp/x", "gpu0");
  ExpectInvalid("ITHACA_GPU=\"gpu0\"");
  Set("0", "2x", "file:/tmp/x", nullptr);
  ExpectInvalid("ITHACA_WORLD_SIZE=\"2x\"");
  Set("0", "2", "file:/tmp/x", nullptr);
  setenv(kEnvGlooIssueDelay, "soon", 1);
  ExpectInvalid("ITHACA_GLOO_ISSUE_DELAY_MS=\"soon\"");
}

TEST(ConnectCommTest, OneCpuRankIsASelfComm) {
  RankInfo info;
  auto comm = ConnectComm(info, Device::kCpu, 5);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->size(), 1);
  float x = 3;
  EXPECT_TRUE((*comm)->AllReduce(Tensor(&x, DType::kF32, {1})).ok());
  EXPECT_EQ(x, 3);
}

TEST(ConnectCommTest, CpuRanksUseGloo) {
  testing::TempDir dir;
  auto outcomes = testing::RunRanks(3, [&](int rank) -> absl::Status {
    RankInfo info;
    info.rank = rank;
    info.world = 3;
    info.rendezvous = dir.rendezvous();
    ASSIGN_OR_RETURN(auto comm, ConnectComm(info, Device::kCpu, 10));
    RANK_CHECK(comm->size() == 3 && comm->rank() == rank);
    float x = static_cast<float>(rank + 1);
    RETURN_IF_ERROR(comm->AllReduce(Tensor(&x, DType::kF32, {1})));
    RANK_CHECK(x == 6, "sum ", x);
    return absl::OkStatus();
  });
  EXPECT_EQ(testing::Failures(outcomes), "");
}

}  // namespace
}  // namespace ithaca
