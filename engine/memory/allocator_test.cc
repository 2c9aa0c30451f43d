#include "engine/memory/allocator.h"

#include "gtest/gtest.h"

namespace ithaca {
namespace {

TEST(AllocatorTest, TracksCurrentAndPeakPerTier) {
  HostAllocator alloc;
  MemoryTracker& t = alloc.tracker();
  {
    auto a = Buffer::Make(&alloc, DType::kF32, {100}, Tier::kParams);
    ASSERT_TRUE(a.ok());
    auto b = Buffer::Make(&alloc, DType::kBF16, {10, 10}, Tier::kAttention);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(t.current(Tier::kParams), 400);
    EXPECT_EQ(t.current(Tier::kAttention), 200);
    EXPECT_EQ(t.device_current(), 600);
    b->Reset();
    EXPECT_EQ(t.current(Tier::kAttention), 0);
    EXPECT_EQ(t.peak(Tier::kAttention), 200);
    auto off = Buffer::Make(&alloc, DType::kF32, {50}, Tier::kHostOffload);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(t.device_current(), 400);  // host offload is not device memory
    EXPECT_EQ(t.current(Tier::kHostOffload), 200);
  }
  EXPECT_EQ(t.device_current(), 0);
  EXPECT_EQ(t.device_peak(), 600);
  t.ResetPeaks();
  EXPECT_EQ(t.peak(Tier::kParams), 0);
}

TEST(AllocatorTest, LimitGivesResourceExhaustedNamingTheTier) {
  HostAllocator alloc(1000);
  auto a = Buffer::Make(&alloc, DType::kF32, {200}, Tier::kParams);
  ASSERT_TRUE(a.ok());
  auto b = Buffer::Make(&alloc, DType::kF32, {100}, Tier::kActivations);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("activations"), std::string::npos);
}

TEST(AllocatorTest, MovedBufferFreesOnce) {
  HostAllocator alloc;
  auto a = Buffer::Make(&alloc, DType::kI32, {8}, Tier::kComm);
  ASSERT_TRUE(a.ok());
  Buffer moved = std::move(*a);
  EXPECT_TRUE(a->empty());
  EXPECT_EQ(alloc.tracker().current(Tier::kComm), 32);
  moved.Reset();
  EXPECT_EQ(alloc.tracker().current(Tier::kComm), 0);
}

}  // namespace
}  // namespace ithaca
