#include "engine/plan/step_time.h"

#include <gtest/gtest.h>

#include "engine/plan/meta.h"

namespace ithaca {
namespace {

TEST(RateTable, CommittedTablesParse) {
  for (const std::string& name : BuiltinRateTableNames()) {
    absl::StatusOr<RateTable> t = BuiltinRateTable(name);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    EXPECT_EQ(t->device, name);
  }
  EXPECT_EQ(BuiltinRateTable("tpu").status().code(), absl::StatusCode::kNotFound);
}

TEST(RateTable, TheGpusNameChoosesTheTable) {
  EXPECT_EQ(RateTableNameFor(Device::kCuda, "NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(RateTableNameFor(Device::kCuda, "h100x8,host_gib=1024"), "h100");
  EXPECT_EQ(RateTableNameFor(Device::kCuda, "NVIDIA H200"), "h200");
  EXPECT_EQ(RateTableNameFor(Device::kCuda, ""), "h200");
  EXPECT_EQ(RateTableNameFor(Device::kCpu, "NVIDIA H100 80GB HBM3"), "cpu");
  EXPECT_EQ(DefaultRateTable(Device::kCuda, "NVIDIA H100 PCIe").device, "h100");
  EXPECT_EQ(DefaultRateTable(Device::kCuda).device, "h200");
  EXPECT_EQ(DefaultRateTable(Device::kCpu).device, "cpu");
}

TEST(RateTable, TextRoundTrips) {
  RateTable t;
  t.device = "x";
  t.gemms.push_back({{4096, 2048, 8192, false, true, true}, 0.001});
  t.attention.push_back({true, 128, 8, 65536, 5e14});
  t.ops["rmsnorm"] = {3e12, 4e-6};
  t.h2d_bytes_per_s = 5e10;
  absl::StatusOr<RateTable> back = ParseRateTable(RateTableText(t));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(RateTableText(*back), RateTableText(t));
  ASSERT_EQ(back->gemms.size(), 1u);
  EXPECT_TRUE(back->gemms[0].shape == t.gemms[0].shape);
}

TEST(RateTable, BadLinesNameTheLine) {
  absl::StatusOr<RateTable> t = ParseRateTable("gemm_flops 1e12\ngemm 1 2 3\n");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status();
  EXPECT_FALSE(ParseRateTable("gemm_flops 1e12\nwarp 9\n").ok());
  EXPECT_FALSE(ParseRateTable("gemm_flops -3\n").ok());
}

TEST(StepTime, GemmTakesTheNearestShapeScaledByFlops) {
  RateTable t;
  t.gemms.push_back({{1024, 1024, 1024, false, true, false}, 1.0});
  t.gemms.push_back({{65536, 4096, 4096, false, true, false}, 2.0});
  EXPECT_DOUBLE_EQ(GemmSeconds(t, {1024, 1024, 1024, false, true, false}), 1.0);
  // Twice the rows of the large shape: twice its time.
  EXPECT_DOUBLE_EQ(GemmSeconds(t, {131072, 4096, 4096, false, true, false}), 4.0);
}

TEST(StepTime, AttentionInterpolatesByLengthAndMasksByKeysSeen) {
  RateTable t;
  t.gemm_flops_per_s = 1;
  t.attention.push_back({false, 128, 8, 1024, 1e14});
  t.attention.push_back({false, 128, 8, 4096, 3e14});
  t.attention.push_back({false, 128, 1, 4096, 1e12});  // fewer heads: another row
  const double causal = AttentionPairs(4096, 0, {});
  EXPECT_DOUBLE_EQ(causal, 4096.0 * 4096.0);
  EXPECT_DOUBLE_EQ(AttentionSeconds(t, false, 4096, causal, 8, 128),
                   AttentionFlops(false, causal, 8, 128) / 3e14);
  // 2048: halfway in log2 between the rows.
  const double mid = AttentionPairs(2048, 0, {});
  EXPECT_DOUBLE_EQ(AttentionSeconds(t, false, 2048, mid, 8, 128),
                   AttentionFlops(false, mid, 8, 128) / 2e14);
  // Four documents of 1024 in 4096 tokens: the rate of 1024-token samples.
  const double docs = AttentionPairs(4096, 0, {0, 1024, 2048, 3072});
  EXPECT_DOUBLE_EQ(docs, 4 * 1024.0 * 1024.0);
  EXPECT_DOUBLE_EQ(AttentionSeconds(t, false, 4096, docs, 8, 128),
                   AttentionFlops(false, docs, 8, 128) / 1e14);
}

TEST(StepClock, OverlapsCopiesAndCollectivesWithCompute) {
  StepClock c;
  c.Compute(1.0, StepClock::Work::kGemm);
  const uint64_t copy = c.Transfer(0.5, /*unordered=*/false);  // starts at 1.0
  c.Compute(2.0, StepClock::Work::kAttention);                 // 1.0 .. 3.0
  c.WaitTransfer(copy);                                        // done at 1.5: no wait
  EXPECT_DOUBLE_EQ(c.compute_end(), 3.0);
  EXPECT_DOUBLE_EQ(c.waited(), 0.0);
  const uint64_t late = c.Transfer(4.0, false);  // 3.0 .. 7.0
  c.Compute(1.0, StepClock::Work::kGemm);        // 3.0 .. 4.0
  c.WaitTransfer(late);
  EXPECT_DOUBLE_EQ(c.compute_end(), 7.0);
  EXPECT_DOUBLE_EQ(c.waited(), 3.0);
  // A blocking collective: compute waits at once; an issued one, only at its wait.
  c.Collective(1.0, /*deferred=*/false);
  EXPECT_DOUBLE_EQ(c.compute_end(), 8.0);
  const uint64_t issued = c.Collective(2.0, /*deferred=*/true);  // 8 .. 10
  c.Compute(0.5, StepClock::Work::kGemm);
  EXPECT_DOUBLE_EQ(c.compute_end(), 8.5);
  c.WaitCollective(issued);
  EXPECT_DOUBLE_EQ(c.compute_end(), 10.0);
  EXPECT_DOUBLE_EQ(c.end(), 10.0);
  EXPECT_DOUBLE_EQ(c.busy(StepClock::Work::kGemm), 2.5);
}

TEST(StepClock, MetaOpsPriceCopiesByDirection) {
  RateTable t;
  t.gemm_flops_per_s = 1e12;
  t.h2d_bytes_per_s = 1e9;
  t.d2h_bytes_per_s = 0.5e9;
  StepClock clock;
  MetaOps ops(Device::kCuda, DType::kBF16);
  ops.set_timing(&t, &clock);
  MetaAllocator alloc(Device::kCuda);
  absl::StatusOr<Buffer> dev =
      Buffer::Make(&alloc, DType::kBF16, {500'000'000}, Tier::kBlockInputs);
  absl::StatusOr<Buffer> host =
      Buffer::Make(&alloc, DType::kBF16, {500'000'000}, Tier::kHostBlockInputs);
  ASSERT_TRUE(dev.ok() && host.ok());
  ops.WaitFence(ops.CopyAsync(dev->tensor(), host->tensor()));  // 1e9 bytes down: 2 s
  EXPECT_DOUBLE_EQ(clock.compute_end(), 2.0);
  ops.WaitFence(ops.CopyAsync(host->tensor(), dev->tensor()));  // up: 1 s
  EXPECT_DOUBLE_EQ(clock.compute_end(), 3.0);
}

// A ring shift holds the comm stream for its rank's own link: NVLink inside a node, the NIC at a
// node's edge; the blocking form makes compute wait at once, the issued one at its Wait.
TEST(StepClock, MetaCommSendRecvTakesThePeersLink) {
  LinkModel link;
  link.nvlink = {100e9, 0};
  link.ib = {10e9, 0};
  StepClock clock;
  MetaComm ring(3, 8);  // 4 ranks a node: 2 -> 3 -> 4 crosses to node 1
  ring.set_timing(&link, 4, &clock);
  const Tensor block(nullptr, DType::kBF16, {500'000'000});  // 1e9 bytes
  ASSERT_TRUE(ring.SendRecv(block, 2, block, 1).ok());       // inside node 0: 0.01 s
  EXPECT_DOUBLE_EQ(clock.compute_end(), 0.01);
  absl::StatusOr<Issued> issued = ring.IssueSendRecv(block, 4, block, 2);  // over the NIC: 0.1 s
  ASSERT_TRUE(issued.ok());
  EXPECT_DOUBLE_EQ(clock.compute_end(), 0.01);
  ASSERT_TRUE(issued->Wait().ok());
  EXPECT_DOUBLE_EQ(clock.compute_end(), 0.11);
  ASSERT_TRUE(ring.SendRecv(block, 3, block, 3).ok());  // a copy to itself: no link time
  EXPECT_DOUBLE_EQ(clock.end(), 0.11);
}

// A shift around the ring is every member's at once and ends with its slowest hop: rank 1's own
// peers share its node, yet the shift waits for 3 -> 4 over the NIC. A ring inside one node, and
// an exchange that is no shift, take the rank's own links.
TEST(StepClock, MetaCommRingShiftTakesItsSlowestHop) {
  LinkModel link;
  link.nvlink = {100e9, 0};
  link.ib = {10e9, 0};
  const Tensor block(nullptr, DType::kBF16, {500'000'000});  // 1e9 bytes
  StepClock clock;
  MetaComm ring(1, 8);  // 4 ranks a node
  ring.set_timing(&link, 4, &clock);
  ASSERT_TRUE(ring.SendRecv(block, 2, block, 0).ok());  // shift by 1: 3 -> 4 and 7 -> 0 cross
  EXPECT_DOUBLE_EQ(clock.compute_end(), 0.1);
  ASSERT_TRUE(ring.SendRecv(block, 0, block, 2).ok());  // shift by -1: the same hops back
  EXPECT_DOUBLE_EQ(clock.compute_end(), 0.2);
  ASSERT_TRUE(ring.SendRecv(block, 2, block, 3).ok());  // no shift: rank 1's own links
  EXPECT_DOUBLE_EQ(clock.compute_end(), 0.21);
  StepClock inside_clock;
  MetaComm inside(1, 4);  // the whole ring on one node
  inside.set_timing(&link, 4, &inside_clock);
  ASSERT_TRUE(inside.SendRecv(block, 2, block, 0).ok());
  EXPECT_DOUBLE_EQ(inside_clock.compute_end(), 0.01);
}

}  // namespace
}  // namespace ithaca
