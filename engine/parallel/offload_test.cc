// BlockInputStore on the CPU, with asynchronous copies simulated at their worst: a CopyAsync
// runs only when it is waited on (as late as a real copy stream could run it), and an allocator
// poisons memory on free and fails the test when a buffer of a copy still in flight is freed.
// Data that survives a round trip was therefore never read before it was written nor freed
// while a copy still needed it.
#include "engine/parallel/offload.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/backend/cpu/cpu_ops.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

// CpuOps whose CopyAsync is deferred until a WaitFence covers it.
class LateCopyOps : public CpuOps {
 public:
  Fence CopyAsync(const Tensor& src, const Tensor& dst) override {
    EXPECT_EQ(src.bytes(), dst.bytes());
    pending_.push_back({src, dst, ++last_});
    return Fence{last_};
  }
  void WaitFence(Fence fence) override {
    ASSERT_LE(fence.ticket, last_);
    while (!pending_.empty() && pending_.front().ticket <= fence.ticket) {
      Copy(pending_.front().src, pending_.front().dst);
      pending_.erase(pending_.begin());
    }
  }
  // Whether [p, p + bytes) is read or written by a copy not yet waited on.
  bool InFlight(const void* p, size_t bytes) const {
    const char* a = static_cast<const char*>(p);
    for (const Pending& c : pending_) {
      for (const Tensor* t : {&c.src, &c.dst}) {
        const char* b = static_cast<const char*>(t->data);
        if (a < b + t->bytes() && b < a + bytes) return true;
      }
    }
    return false;
  }
  size_t num_pending() const { return pending_.size(); }

 private:
  struct Pending {
    Tensor src, dst;
    uint64_t ticket;
  };
  std::vector<Pending> pending_;
  uint64_t last_ = 0;
};

// Host memory that is poisoned (NaN) when freed, and never handed out again during the test, so
// a late read of freed memory sees NaN; freeing memory a pending copy touches is a failure.
class PoisoningAllocator : public Allocator {
 public:
  explicit PoisoningAllocator(const LateCopyOps* ops) : ops_(ops) {}
  ~PoisoningAllocator() override {
    for (void* p : blocks_) std::free(p);
  }
  Device device() const override { return Device::kCpu; }
  absl::StatusOr<void*> Allocate(size_t bytes, Tier tier) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    Poison(p, bytes);
    blocks_.push_back(p);
    tracker_.OnAlloc(tier, bytes);
    return p;
  }
  void Free(void* ptr, size_t bytes, Tier tier) override {
    EXPECT_FALSE(ops_->InFlight(ptr, bytes))
        << TierName(tier) << " buffer freed while a copy still uses it";
    Poison(ptr, bytes);
    tracker_.OnFree(tier, bytes);
  }

 private:
  static void Poison(void* p, size_t bytes) {
    const float nan = std::nanf("");
    for (size_t i = 0; i + sizeof(float) <= bytes; i += sizeof(float)) {
      std::memcpy(static_cast<char*>(p) + i, &nan, sizeof(float));
    }
  }
  const LateCopyOps* ops_;
  std::vector<void*> blocks_;
};

constexpr int64_t kRows = 5, kWidth = 7;

float Value(int block, int which, int64_t i) { return 1000.f * block + 100.f * which + i; }

Buffer Filled(Allocator* alloc, Ops& ops, int block, int which, Shape shape) {
  auto b = Buffer::Make(alloc, DType::kF32, shape, Tier::kBlockInputs);
  EXPECT_TRUE(b.ok()) << b.status();
  std::vector<float> v(static_cast<size_t>(b->tensor().numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = Value(block, which, static_cast<int64_t>(i));
  ops.Upload(v.data(), DType::kF32, b->tensor());
  return std::move(*b);
}

SavedInputs Saved(Allocator* alloc, Ops& ops, int block) {
  SavedInputs s;
  s.x = Filled(alloc, ops, block, 0, {kRows, kWidth});
  s.o = Filled(alloc, ops, block, 1, {kRows, 2 * kWidth});
  s.lse = Filled(alloc, ops, block, 2, {3, kRows});
  return s;
}

void ExpectBuffer(const Buffer& b, int block, int which) {
  ASSERT_FALSE(b.empty()) << "block " << block << " buffer " << which;
  const Tensor& t = b.tensor();
  for (int64_t i = 0; i < t.numel(); ++i) {
    ASSERT_EQ(t.f32()[i], Value(block, which, i))
        << "block " << block << " buffer " << which << " element " << i;
  }
}

void ExpectSaved(const SavedInputs& s, int block) {
  ExpectBuffer(s.x, block, 0);
  ExpectBuffer(s.o, block, 1);
  ExpectBuffer(s.lse, block, 2);
}

class BlockInputStoreRoundTrip : public ::testing::TestWithParam<bool> {
 protected:
  LateCopyOps ops_;
  PoisoningAllocator alloc_{&ops_};
};

// The forward/backward pattern of LlamaModel::ForwardBackward: Put every block, then Take in
// reverse, prefetching one block ahead when the parameter is true.
TEST_P(BlockInputStoreRoundTrip, LateCopies) {
  const bool prefetch = GetParam();
  const int L = 5;
  const int64_t block_bytes = (kRows * kWidth + kRows * 2 * kWidth + 3 * kRows) * 4;
  {
    BlockInputStore store(&ops_, &alloc_, L, /*offload=*/true, /*keep_last=*/1);
    for (int l = 0; l < L; ++l) {
      ASSERT_TRUE(store.Put(l, Saved(&alloc_, ops_, l)).ok());
      // An offloaded block's device buffers stay until the next Put (its copy is in flight),
      // which frees them: one block's worth is on the device at a time (the last, kept one too).
      EXPECT_EQ(alloc_.tracker().current(Tier::kBlockInputs), block_bytes) << "after Put " << l;
      EXPECT_EQ(alloc_.tracker().current(Tier::kHostBlockInputs),
                std::min(l + 1, L - 1) * block_bytes)
          << "after Put " << l;
    }
    for (int l = L - 1; l >= 0; --l) {
      auto saved = store.Take(l);
      ASSERT_TRUE(saved.ok()) << saved.status();
      if (prefetch) {
        ASSERT_TRUE(store.Prefetch(l - 1).ok());
      }
      ExpectSaved(*saved, l);
    }
    EXPECT_EQ(alloc_.tracker().current(Tier::kHostBlockInputs), 0);
  }
  EXPECT_EQ(ops_.num_pending(), 0u);
  EXPECT_EQ(alloc_.tracker().current(Tier::kBlockInputs), 0);
}

INSTANTIATE_TEST_SUITE_P(Prefetch, BlockInputStoreRoundTrip, ::testing::Bool());

TEST(BlockInputStoreTest, PeekInputCopiesWhileTheHostKeepsIt) {
  LateCopyOps ops;
  PoisoningAllocator alloc(&ops);
  BlockInputStore store(&ops, &alloc, 3, /*offload=*/true, /*keep_last=*/0);
  for (int l = 0; l < 3; ++l) ASSERT_TRUE(store.Put(l, Saved(&alloc, ops, l)).ok());
  Buffer copy;
  auto x = store.PeekInput(1, &copy);
  ASSERT_TRUE(x.ok()) << x.status();
  ExpectBuffer(copy, 1, 0);
  copy.Reset();
  // The host copy is still there for Take; a prefetch in flight is waited for by PeekInput.
  ASSERT_TRUE(store.Prefetch(2).ok());
  Buffer none;
  auto x2 = store.PeekInput(2, &none);
  ASSERT_TRUE(x2.ok());
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(x2->f32()[3], Value(2, 0, 3));
  auto taken = store.Take(1);
  ASSERT_TRUE(taken.ok());
  ExpectSaved(*taken, 1);
}

// Dropping a store with copies in flight waits for them before freeing their buffers (the
// allocator fails the test otherwise).
TEST(BlockInputStoreTest, DestroyedWithCopiesInFlight) {
  LateCopyOps ops;
  PoisoningAllocator alloc(&ops);
  {
    BlockInputStore store(&ops, &alloc, 3, /*offload=*/true, /*keep_last=*/0);
    for (int l = 0; l < 3; ++l) ASSERT_TRUE(store.Put(l, Saved(&alloc, ops, l)).ok());
    ASSERT_TRUE(store.Prefetch(1).ok());
    EXPECT_GT(ops.num_pending(), 0u);
  }
  EXPECT_EQ(ops.num_pending(), 0u);
  EXPECT_EQ(alloc.tracker().current(Tier::kBlockInputs), 0);
  EXPECT_EQ(alloc.tracker().current(Tier::kHostBlockInputs), 0);
}

// With the synchronous default (CpuOps) nothing changes for the schedule.
TEST(BlockInputStoreTest, SynchronousCopiesOnCpuOps) {
  CpuOps ops;
  HostAllocator alloc;
  BlockInputStore store(&ops, &alloc, 2, /*offload=*/true, /*keep_last=*/0);
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(store.Put(l, Saved(&alloc, ops, l)).ok());
  for (int l = 1; l >= 0; --l) {
    auto s = store.Take(l);
    ASSERT_TRUE(s.ok());
    ExpectSaved(*s, l);
  }
}

}  // namespace
}  // namespace ithaca
