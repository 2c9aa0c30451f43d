// CudaOps' copy stream (CopyAsync / WaitFence) and the BlockInputStore on it: transfers are
// ordered after the compute work before them, later compute work waits for them, buffers are
// neither reused nor freed under a copy in flight, the host never waits, and a copy overlaps
// compute. Races are provoked on purpose: the compute stream is kept busy with GEMMs, the copy
// stream is slowed by large dummy transfers, and freed memory is at once reused and overwritten.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "engine/parallel/offload.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using Clock = std::chrono::steady_clock;

class CopyStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    alloc_ = std::make_unique<CudaAllocator>();
    CudaOps::Options o;
    o.alloc = alloc_.get();
    ops_ = std::make_unique<CudaOps>(o);
    const int64_t n = 4096;
    gemm_a_ = Make(DType::kBF16, {n, n}, Tier::kActivations);
    gemm_c_ = Make(DType::kF32, {n, n}, Tier::kActivations);
    ops_->Fill(gemm_a_.tensor(), 0.01f);
    junk_device_ = Make(DType::kF32, {kJunkElems}, Tier::kActivations);
    junk_host_ = Make(DType::kF32, {kJunkElems}, Tier::kHostBlockInputs);
    ops_->Synchronize();
  }

  Buffer Make(DType t, Shape s, Tier tier) {
    auto b = Buffer::Make(alloc_.get(), t, std::move(s), tier);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }
  // Several milliseconds of GEMMs on the compute stream.
  void BusyCompute(int gemms = 25) {
    for (int i = 0; i < gemms; ++i) {
      ops_->Gemm(gemm_a_.tensor(), false, gemm_a_.tensor(), true, gemm_c_.tensor(), 1.f, 0.f);
    }
  }
  // A 256 MiB device-to-host transfer queued on the copy stream, so the next CopyAsync starts
  // late; timed with events (the host does not wait).
  void BusyCopyStream() {
    cudaStream_t copy = ops_->stream(CudaOps::Stream::kCopy);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, copy);
    cudaMemcpyAsync(junk_host_.tensor().data, junk_device_.tensor().data,
                    junk_device_.tensor().bytes(), cudaMemcpyDeviceToHost, copy);
    cudaEventRecord(b, copy);
    busy_copies_.push_back({a, b});
  }
  // Total time of the dummy transfers so far (synchronizes).
  double BusyCopyMs() {
    cudaDeviceSynchronize();
    double ms = 0;
    for (auto& [a, b] : busy_copies_) {
      float t = 0;
      cudaEventElapsedTime(&t, a, b);
      ms += t;
      cudaEventDestroy(a);
      cudaEventDestroy(b);
    }
    busy_copies_.clear();
    return ms;
  }

  static constexpr int64_t kJunkElems = int64_t{64} << 20;
  std::unique_ptr<CudaAllocator> alloc_;
  std::unique_ptr<CudaOps> ops_;
  Buffer gemm_a_, gemm_c_, junk_device_, junk_host_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> busy_copies_;
};

std::vector<float> Pattern(int64_t n, int block, int which) {
  std::vector<float> v(static_cast<size_t>(n));
  // Integers below 2^24: exact in f32.
  for (int64_t i = 0; i < n; ++i) {
    v[i] = 1e6f * block + 1e5f * which + static_cast<float>(i % 99991);
  }
  return v;
}

int64_t Mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
  return bad;
}

TEST_F(CopyStreamTest, CopyIsOrderedBothWays) {
  const int64_t n = int64_t{64} << 20;  // 256 MiB of f32: a copy of several milliseconds
  Buffer x = Make(DType::kF32, {n}, Tier::kActivations);
  Buffer host = Make(DType::kF32, {n}, Tier::kHostBlockInputs);
  // Device to host: the source is written last behind busy compute, and overwritten right after
  // the WaitFence. The host copy must hold exactly the value in between.
  ops_->Fill(x.tensor(), 1.f);
  BusyCompute();
  ops_->Fill(x.tensor(), 7.f);
  const Ops::Fence f = ops_->CopyAsync(x.tensor(), host.tensor());
  ops_->WaitFence(f);
  ops_->Fill(x.tensor(), -1.f);
  ops_->Synchronize();
  const float* h = host.tensor().f32();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += h[i] != 7.f;
  EXPECT_EQ(bad, 0) << "device-to-host copy not ordered with the compute stream";

  // Host to device behind a slow copy stream: compute work after the WaitFence must see the
  // copied data, not what the destination held before.
  std::vector<float> want = Pattern(n, 3, 0);
  std::memcpy(host.tensor().data, want.data(), n * sizeof(float));
  ops_->Fill(x.tensor(), std::nanf(""));
  BusyCopyStream();
  ops_->WaitFence(ops_->CopyAsync(host.tensor(), x.tensor()));
  Buffer y = Make(DType::kF32, {n}, Tier::kActivations);
  ops_->Copy(x.tensor(), y.tensor());
  EXPECT_EQ(Mismatches(cuda_test::Host(*ops_, y.tensor()), want), 0)
      << "compute read the destination before the host-to-device copy finished";
  BusyCopyMs();
}

TEST_F(CopyStreamTest, FencesCoverEarlierCopiesAndCanBeWaitedInAnyOrder) {
  const int64_t n = 1 << 20;
  std::vector<Buffer> dev, host;
  std::vector<Ops::Fence> fences;
  BusyCopyStream();
  for (int i = 0; i < 4; ++i) {
    dev.push_back(Make(DType::kF32, {n}, Tier::kActivations));
    host.push_back(Make(DType::kF32, {n}, Tier::kHostBlockInputs));
    ops_->Fill(dev[i].tensor(), static_cast<float>(i));
    fences.push_back(ops_->CopyAsync(dev[i].tensor(), host[i].tensor()));
    EXPECT_TRUE(fences.back().pending());
  }
  ops_->WaitFence(fences[2]);  // covers 0 and 1
  ops_->WaitFence(fences[0]);  // already covered: a no-op
  ops_->WaitFence(fences[3]);
  ops_->Synchronize();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(host[i].tensor().f32()[n - 1], static_cast<float>(i)) << i;
  }
  BusyCopyMs();
}

TEST_F(CopyStreamTest, CopyOverlapsCompute) {
  const int64_t n = int64_t{256} << 20;  // 1 GiB of f32 to the host
  Buffer x = Make(DType::kF32, {n}, Tier::kActivations);
  Buffer host = Make(DType::kF32, {n}, Tier::kHostBlockInputs);
  ops_->Fill(x.tensor(), 2.f);
  ops_->Synchronize();
  cudaEvent_t g0, g1, c0, c1;
  for (cudaEvent_t* e : {&g0, &g1, &c0, &c1}) cudaEventCreate(e);
  cudaStream_t copy = ops_->stream(CudaOps::Stream::kCopy);
  cudaEventRecord(g0, ops_->stream());
  cudaEventRecord(c0, copy);
  const Ops::Fence f = ops_->CopyAsync(x.tensor(), host.tensor());
  cudaEventRecord(c1, copy);
  BusyCompute(100);
  cudaEventRecord(g1, ops_->stream());
  ops_->WaitFence(f);
  ops_->Synchronize();
  float copy_ms = 0, gemm_ms = 0, copy_end = 0, gemm_end = 0;
  cudaEventElapsedTime(&copy_ms, c0, c1);
  cudaEventElapsedTime(&gemm_ms, g0, g1);
  cudaEventElapsedTime(&copy_end, g0, c1);
  cudaEventElapsedTime(&gemm_end, g0, g1);
  const float both = std::max(copy_end, gemm_end);
  std::printf("  copy %.2f ms, compute %.2f ms, both %.2f ms (serial would be %.2f ms)\n", copy_ms,
              gemm_ms, both, copy_ms + gemm_ms);
  ASSERT_GT(copy_ms, 1.f);
  ASSERT_GT(gemm_ms, 1.f);
  // At least half of the shorter one ran alongside the other.
  EXPECT_LT(both, copy_ms + gemm_ms - 0.5f * std::min(copy_ms, gemm_ms));
  EXPECT_EQ(host.tensor().f32()[n - 1], 2.f);
  for (cudaEvent_t e : {g0, g1, c0, c1}) cudaEventDestroy(e);
}

// The forward/backward pattern of LlamaModel::ForwardBackward on a BlockInputStore that
// offloads, under provoked races: each saved buffer is written last behind busy compute, the
// copy stream is slowed before every Put, Prefetch and Take, and whatever memory the store frees
// is taken at once by new allocations that are overwritten with NaN. Everything read back must
// equal what was saved, and the store's calls must not block the host.
class BlockInputStoreOnCuda : public CopyStreamTest, public ::testing::WithParamInterface<bool> {};

TEST_P(BlockInputStoreOnCuda, RoundTripUnderRaces) {
  const bool prefetch = GetParam();
  const int L = 6;
  const Shape shapes[3] = {{1024, 4096}, {1024, 4096}, {8, 1024}};  // x, o, lse
  std::vector<std::vector<float>> want[3];
  std::vector<Buffer> sources[3], results[3];
  for (int w = 0; w < 3; ++w) {
    for (int l = 0; l < L; ++l) {
      want[w].push_back(Pattern(NumElements(shapes[w]), l, w));
      sources[w].push_back(cuda_test::Dev(*ops_, alloc_.get(), DType::kF32, shapes[w], want[w][l]));
      results[w].push_back(Make(DType::kF32, shapes[w], Tier::kActivations));
    }
  }
  // Allocates buffers of the saved shapes, all at once (so they take what was just freed), and
  // poisons them.
  auto reuse_and_poison = [&] {
    std::vector<Buffer> reused;
    for (const Shape& s : shapes) {
      reused.push_back(Make(DType::kF32, s, Tier::kBlockInputs));
      ops_->Fill(reused.back().tensor(), std::nanf(""));
    }
  };
  // Two passes: the first fills the allocator's caches (cudaHostAlloc may be slow), the second
  // is timed on the host.
  for (int pass = 0; pass < 2; ++pass) {
    double store_ms = 0;
    auto timed = [&](auto&& call) {
      const auto t0 = Clock::now();
      absl::Status st = call();
      store_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      return st;
    };
    for (int w = 0; w < 3; ++w) {
      for (Buffer& r : results[w]) ops_->Fill(r.tensor(), std::nanf(""));
    }
    {
      BlockInputStore store(ops_.get(), alloc_.get(), L, /*offload=*/true, /*keep_last=*/1);
      for (int l = 0; l < L; ++l) {
        BusyCompute(5);
        SavedInputs in;
        Buffer* bufs[3] = {&in.x, &in.o, &in.lse};
        for (int w = 0; w < 3; ++w) {
          *bufs[w] = Make(DType::kF32, shapes[w], Tier::kBlockInputs);
          ops_->Copy(sources[w][l].tensor(), bufs[w]->tensor());
        }
        BusyCopyStream();
        ASSERT_TRUE(timed([&] { return store.Put(l, std::move(in)); }).ok());
        reuse_and_poison();
      }
      Buffer peek;
      BusyCopyStream();
      auto x1 = store.PeekInput(1, &peek);
      ASSERT_TRUE(x1.ok()) << x1.status();
      Buffer peeked = Make(DType::kF32, shapes[0], Tier::kActivations);
      ops_->Copy(*x1, peeked.tensor());
      peek.Reset();
      reuse_and_poison();
      for (int l = L - 1; l >= 0; --l) {
        BusyCopyStream();
        absl::StatusOr<SavedInputs> got;
        ASSERT_TRUE(timed([&] {
                      got = store.Take(l);
                      return got.status();
                    }).ok());
        const Buffer* bufs[3] = {&got->x, &got->o, &got->lse};
        for (int w = 0; w < 3; ++w) ops_->Copy(bufs[w]->tensor(), results[w][l].tensor());
        if (prefetch) {
          BusyCopyStream();
          ASSERT_TRUE(timed([&] { return store.Prefetch(l - 1); }).ok());
        }
        BusyCompute(5);
        *got = SavedInputs{};  // freed, then reused at once
        reuse_and_poison();
      }
      EXPECT_EQ(Mismatches(cuda_test::Host(*ops_, peeked.tensor()), want[0][1]), 0) << "peek";
    }
    const double busy_ms = BusyCopyMs();
    for (int w = 0; w < 3; ++w) {
      for (int l = 0; l < L; ++l) {
        EXPECT_EQ(Mismatches(cuda_test::Host(*ops_, results[w][l].tensor()), want[w][l]), 0)
            << "pass " << pass << ", block " << l << ", buffer " << w;
      }
    }
    std::printf("  pass %d: store calls %.2f ms on the host; dummy copies %.2f ms on the GPU\n",
                pass, store_ms, busy_ms);
    // A host wait on either stream inside the store would cost about the dummy copies' time.
    if (pass == 1) {
      EXPECT_LT(store_ms, 0.25 * busy_ms);
    }
  }
  EXPECT_EQ(alloc_->tracker().current(Tier::kBlockInputs), 0);
  EXPECT_EQ(alloc_->tracker().current(Tier::kHostBlockInputs),
            static_cast<int64_t>(junk_host_.tensor().bytes()));
}

INSTANTIATE_TEST_SUITE_P(Prefetch, BlockInputStoreOnCuda, ::testing::Bool());

}  // namespace
}  // namespace ithaca
