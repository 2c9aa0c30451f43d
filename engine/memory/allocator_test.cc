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
    auto off = Buffer::Make(&alloc, DType::kF32, {50}, Tier::kHostBlockInputs);
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(t.device_current(), 400);  // host offload is not device memory
    EXPECT_EQ(t.current(Tier::kHostBlockInputs), 200);
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

namespace ithaca {
namespace {

// The CUDA allocator's caching rule: a class's freed blocks serve its later requests, so only
// the most blocks live at once per class are ever reserved; other classes do not share them.
TEST(SizeClassCacheTest, ReservesEachClassAtItsMostBlocksLiveAtOnce) {
  EXPECT_EQ(SizeClassCache::SizeClass(1), 512u);
  EXPECT_EQ(SizeClassCache::SizeClass((size_t{5} << 20) + 7), size_t{6} << 20);
  SizeClassCache c;
  c.OnAlloc(1000);  // class 1024
  c.OnFree(1000);
  c.OnAlloc(600);  // the same class: served from the cache
  EXPECT_EQ(c.reserved(), 1024);
  c.OnAlloc(3 << 20);  // class 4 MiB, twice at once
  c.OnAlloc(3 << 20);
  c.OnFree(3 << 20);
  c.OnFree(3 << 20);
  EXPECT_EQ(c.reserved(), 1024 + (int64_t{8} << 20));
  // Freed 4 MiB blocks do not serve a 2 MiB request: a new block is reserved although 8 MiB
  // sit free (what makes the allocator hold more than the peak of live bytes).
  c.OnAlloc(2 << 20);
  EXPECT_EQ(c.reserved(), 1024 + (int64_t{10} << 20));
}

}  // namespace
}  // namespace ithaca
