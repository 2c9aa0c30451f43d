// CudaAllocator: per-tier current/peak bytes, reuse of freed blocks without new cudaMalloc calls
// (the steady state of a training step), pinned host memory for the host_block_inputs tier, and
// out-of-memory as a status.
#include "engine/backend/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include <vector>

#include "engine/backend/cuda/cuda_test_util.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

TEST(CudaAllocatorTest, SteadyStateReusesBlocksAndTracksTiers) {
  SKIP_WITHOUT_GPU();
  CudaAllocator alloc;
  auto step = [&] {
    std::vector<Buffer> live;
    for (int i = 0; i < 5; ++i) {
      auto b = Buffer::Make(&alloc, DType::kBF16, {1000 + 3 * i, 777}, Tier::kActivations);
      ASSERT_TRUE(b.ok()) << b.status();
      live.push_back(std::move(*b));
    }
    auto a = Buffer::Make(&alloc, DType::kF32, {123457}, Tier::kAttention);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(alloc.tracker().current(Tier::kAttention), 123457 * 4);
  };
  step();
  const int64_t mallocs = alloc.stats().device_mallocs;
  EXPECT_EQ(alloc.tracker().current(Tier::kActivations), 0);
  EXPECT_GT(alloc.tracker().peak(Tier::kActivations), 5 * 1000 * 777 * 2);
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(alloc.stats().device_mallocs, mallocs) << "a repeated step must not call cudaMalloc";
  EXPECT_GE(alloc.stats().device_reserved, alloc.tracker().device_peak());
}

TEST(CudaAllocatorTest, HostOffloadTierIsPinnedHostMemory) {
  SKIP_WITHOUT_GPU();
  CudaAllocator alloc;
  auto b = Buffer::Make(&alloc, DType::kBF16, {4096}, Tier::kHostBlockInputs);
  ASSERT_TRUE(b.ok()) << b.status();
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, b->tensor().data), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  EXPECT_EQ(alloc.tracker().current(Tier::kHostBlockInputs), 8192);
  EXPECT_EQ(alloc.tracker().device_current(), 0) << "host_block_inputs is not a device tier";
  EXPECT_EQ(alloc.stats().host_mallocs, 1);
}

TEST(CudaAllocatorTest, FreeUncachedGivesTheBlockBackToCuda) {
  SKIP_WITHOUT_GPU();
  CudaAllocator alloc;
  auto kept = Buffer::Make(&alloc, DType::kBF16, {3 << 20}, Tier::kActivations);
  ASSERT_TRUE(kept.ok());
  const int64_t base = alloc.stats().device_reserved;
  size_t free_before = 0, free_after = 0, total = 0;
  auto once = Buffer::Make(&alloc, DType::kBF16, {256 << 20}, Tier::kWorkspace);  // 512 MiB
  ASSERT_TRUE(once.ok());
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  EXPECT_EQ(alloc.stats().device_reserved, base + (int64_t{512} << 20));
  once->ResetUncached();
  EXPECT_EQ(alloc.stats().device_reserved, base) << "the block must leave the cache";
  EXPECT_EQ(alloc.tracker().current(Tier::kWorkspace), 0);
  EXPECT_EQ(alloc.tracker().peak(Tier::kWorkspace), int64_t{512} << 20);
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_GE(free_after, free_before + (size_t{500} << 20)) << "CUDA must have the memory back";
  // A plain Free of the same size keeps the block, as before.
  auto cached = Buffer::Make(&alloc, DType::kBF16, {256 << 20}, Tier::kWorkspace);
  ASSERT_TRUE(cached.ok());
  cached->Reset();
  EXPECT_EQ(alloc.stats().device_reserved, base + (int64_t{512} << 20));
}

TEST(CudaAllocatorTest, LimitGivesResourceExhausted) {
  SKIP_WITHOUT_GPU();
  CudaAllocator alloc(1 << 20);
  auto a = Buffer::Make(&alloc, DType::kF32, {200000}, Tier::kParams);
  ASSERT_TRUE(a.ok());
  auto b = Buffer::Make(&alloc, DType::kF32, {200000}, Tier::kGrads);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("grads"), std::string::npos) << b.status();
}

TEST(CudaAllocatorTest, SizeClasses) {
  EXPECT_EQ(CudaAllocator::RoundUp(1), 512u);
  EXPECT_EQ(CudaAllocator::RoundUp(513), 1024u);
  EXPECT_EQ(CudaAllocator::RoundUp((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CudaAllocator::RoundUp((size_t{5} << 20) + 7), size_t{6} << 20);
}

}  // namespace
}  // namespace ithaca
