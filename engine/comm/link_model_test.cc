#include "engine/comm/link_model.h"

#include <gtest/gtest.h>

#include "engine/core/units.h"

namespace ithaca {
namespace {

constexpr double kGB = 1e9, kUs = 1e-6;

LinkModel Simple() {
  LinkModel m;
  m.name = "test";
  m.nvlink = {100 * kGB, 1 * kUs};
  m.ib = {10 * kGB, 5 * kUs};
  return m;
}

TEST(LinkModelTest, RingCollectivesInsideANode) {
  const GroupShape g{8, 1, 8};
  const int64_t b = 800'000'000;  // 0.8 GB
  // (n-1)/n of the bytes at 100 GB/s, plus 7 steps of 1 us.
  EXPECT_NEAR(CollectiveSeconds(Simple(), CollectiveOp::kAllGather, b, g),
              0.7e9 / (100 * kGB) + 7 * kUs, 1e-12);
  EXPECT_NEAR(CollectiveSeconds(Simple(), CollectiveOp::kReduceScatter, b, g),
              0.7e9 / (100 * kGB) + 7 * kUs, 1e-12);
  EXPECT_NEAR(CollectiveSeconds(Simple(), CollectiveOp::kAllReduce, b, g),
              1.4e9 / (100 * kGB) + 14 * kUs, 1e-12);
  // All-to-all: 7/8 over NVLink in one step.
  EXPECT_NEAR(CollectiveSeconds(Simple(), CollectiveOp::kAllToAll, b, g),
              0.7e9 / (100 * kGB) + 1 * kUs, 1e-12);
  EXPECT_EQ(CollectiveSeconds(Simple(), CollectiveOp::kAllGather, b, GroupShape{1, 1, 1}), 0);
}

TEST(LinkModelTest, AcrossNodesTheNicsBoundRings) {
  // 16 ranks over 4 nodes, 4 per node: a ring runs at min(100, 4 * 10) = 40 GB/s.
  const GroupShape g{16, 4, 4};
  const int64_t b = 1'600'000'000;
  EXPECT_NEAR(CollectiveSeconds(Simple(), CollectiveOp::kAllGather, b, g),
              1.5e9 / (40 * kGB) + 15 * 5 * kUs, 1e-12);
  // All-to-all: 3/16 to the node's others over NVLink, 12/16 over the NIC at 10 GB/s.
  EXPECT_NEAR(CollectiveSeconds(Simple(), CollectiveOp::kAllToAll, b, g),
              1.2e9 / (10 * kGB) + 5 * kUs, 1e-12);
  // Eight per node: the NICs (80 GB/s) no longer bound the ring below NVLink's 100.
  EXPECT_NEAR(CollectiveSeconds(Simple(), CollectiveOp::kReduceScatter, b, GroupShape{16, 2, 8}),
              1.5e9 / (80 * kGB) + 15 * 5 * kUs, 1e-12);
}

TEST(LinkModelTest, SendRecvIsOneStepOverTheRanksOwnLink) {
  const int64_t b = 100'000'000;
  EXPECT_NEAR(SendRecvSeconds(Simple(), b, false), 0.1e9 / (100 * kGB) + 1 * kUs, 1e-12);
  EXPECT_NEAR(SendRecvSeconds(Simple(), b, true), 0.1e9 / (10 * kGB) + 5 * kUs, 1e-12);
  // A group's send-recv is priced on its slowest link.
  EXPECT_EQ(CollectiveSeconds(Simple(), CollectiveOp::kSendRecv, b, GroupShape{8, 1, 8}),
            SendRecvSeconds(Simple(), b, false));
  EXPECT_EQ(CollectiveSeconds(Simple(), CollectiveOp::kSendRecv, b, GroupShape{16, 2, 8}),
            SendRecvSeconds(Simple(), b, true));
  EXPECT_STREQ(CollectiveOpName(CollectiveOp::kSendRecv), "send_recv");
}

TEST(LinkModelTest, PresetsAndOverrides) {
  auto parsed = ParseLinkModel("h200-sxm");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const LinkModel h200 = *parsed;
  EXPECT_EQ(h200.name, "h200-sxm");
  EXPECT_GT(h200.nvlink.bytes_per_s, h200.ib.bytes_per_s);
  parsed = ParseLinkModel("h100-sxm,ib_gbps=25,ib_us=2");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const LinkModel m = *parsed;
  EXPECT_EQ(m.name, "custom");
  EXPECT_DOUBLE_EQ(m.ib.bytes_per_s, 25e9);
  EXPECT_DOUBLE_EQ(m.ib.latency_s, 2e-6);
  EXPECT_DOUBLE_EQ(m.nvlink.bytes_per_s, h200.nvlink.bytes_per_s);
  parsed = ParseLinkModel("zero");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const LinkModel z = *parsed;
  EXPECT_EQ(CollectiveSeconds(z, CollectiveOp::kAllToAll, kGiBBytes, GroupShape{8, 1, 8}), 0);
  EXPECT_NE(LinkModelText(h200).find("NVLink 360 GB/s"), std::string::npos);
}

TEST(LinkModelTest, BadTextNamesThePart) {
  auto bad = ParseLinkModel("h300");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("h300"), absl::string_view::npos);
  bad = ParseLinkModel("h100-sxm,nvlink_gbps=fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("nvlink_gbps=fast"), absl::string_view::npos);
  bad = ParseLinkModel("ib=3");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("ib=3"), absl::string_view::npos);
  EXPECT_FALSE(ParseLinkModel("").ok());
  EXPECT_FALSE(ParseLinkModel("ib_us=-1").ok());
}

}  // namespace
}  // namespace ithaca
