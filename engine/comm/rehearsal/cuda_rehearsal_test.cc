// The rehearsal communicator on a GPU: the copies land, each collective holds the comm stream
// for its modeled time, and compute on the compute stream runs under an issued collective
// (overlap is real) but waits for a blocking one.
#include <cuda_runtime.h>

#include <chrono>
#include <functional>
#include <vector>

#include "engine/comm/rehearsal/hold.h"
#include "engine/comm/rehearsal/rehearsal_device.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

class CudaRehearsalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no GPU";
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&comm_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&busy_slot_, sizeof(uint64_t)), cudaSuccess);
  }
  void TearDown() override {
    if (compute_) cudaStreamDestroy(compute_);
    if (comm_) cudaStreamDestroy(comm_);
    if (busy_slot_) cudaFree(busy_slot_);
  }

  // A rank of 8 on one node whose links make `bytes` of all-to-all take about `ms`.
  std::unique_ptr<RehearsalComm> Comm(double ms, int64_t bytes) {
    RehearsalLayout l;
    l.world = 8;
    // 7/8 of the bytes at B bytes/s takes ms: B = 7/8 · bytes / (ms / 1000).
    auto link = ParseLinkModel(
        absl::StrCat("h100-sxm,nvlink_us=0,nvlink_gbps=", 7.0 / 8 * bytes / (ms / 1e3) / 1e9));
    EXPECT_TRUE(link.ok()) << link.status();
    l.link = *link;
    auto c = MakeRehearsalComm(0, l, Device::kCuda);
    EXPECT_TRUE(c.ok()) << c.status();
    (*c)->UseStreams(DeviceStreams{compute_, comm_});
    return std::move(*c);
  }

  // Compute that keeps the compute stream busy for `ms`.
  void Busy(double ms) {
    ASSERT_EQ(LaunchRehearsalStamp(compute_, busy_slot_), cudaSuccess);
    ASSERT_EQ(LaunchRehearsalHold(compute_, busy_slot_, static_cast<uint64_t>(ms * 1e6)),
              cudaSuccess);
  }

  double Ms(const std::function<void()>& body) {
    cudaStreamSynchronize(compute_);
    cudaStreamSynchronize(comm_);
    const auto t0 = std::chrono::steady_clock::now();
    body();
    cudaStreamSynchronize(compute_);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  cudaStream_t compute_ = nullptr, comm_ = nullptr;
  uint64_t* busy_slot_ = nullptr;
};

TEST_F(CudaRehearsalTest, CopiesLandOnTheDevice) {
  auto c = Comm(0.01, 8 * 4);
  std::vector<float> shard = {1, 2, 3, 4};
  float *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, 4 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 32 * sizeof(float)), cudaSuccess);
  cudaMemcpy(in, shard.data(), 16, cudaMemcpyHostToDevice);
  Tensor tin(in, DType::kF32, {4}, Device::kCuda), tout(out, DType::kF32, {32}, Device::kCuda);
  ASSERT_TRUE(c->AllGather(tin, tout).ok());
  std::vector<float> host(32);
  cudaStreamSynchronize(compute_);
  cudaMemcpy(host.data(), out, 128, cudaMemcpyDeviceToHost);
  for (int j = 0; j < 8; ++j) {
    for (int i = 0; i < 4; ++i) EXPECT_EQ(host[4 * j + i], shard[i]) << "slot " << j;
  }
  // Reduce-scatter keeps chunk 0 (this is rank 0): the first 4 of `out`.
  ASSERT_TRUE(c->ReduceScatter(tout, tin).ok());
  cudaStreamSynchronize(compute_);
  std::vector<float> back(4);
  cudaMemcpy(back.data(), in, 16, cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, shard);
  cudaFree(in);
  cudaFree(out);
}

TEST_F(CudaRehearsalTest, HeldForTheModeledTimeAndOverlappedWithCompute) {
  const int64_t n = 1 << 20;  // 4 MB of f32
  auto c = Comm(/*ms=*/60, n * 4);
  float *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, n * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, n * 4), cudaSuccess);
  Tensor tin(in, DType::kF32, {n}, Device::kCuda), tout(out, DType::kF32, {n}, Device::kCuda);
  // Warm (the kernels' first launch).
  ASSERT_TRUE(c->AllToAll(tin, tout).ok());
  // Alone: the collective holds the stream ~60 ms.
  const double alone = Ms([&] { ASSERT_TRUE(c->AllToAll(tin, tout).ok()); });
  EXPECT_GT(alone, 58);
  EXPECT_LT(alone, 90);
  // Issued, with 60 ms of compute after it: both at once, ~60 ms.
  const double overlapped = Ms([&] {
    auto issued = c->IssueAllToAll(tin, tout);
    ASSERT_TRUE(issued.ok());
    Busy(60);
    ASSERT_TRUE(issued->Wait().ok());
  });
  EXPECT_LT(overlapped, 100);
  // Blocking, with the same compute after it: one after the other, ~120 ms.
  const double serial = Ms([&] {
    ASSERT_TRUE(c->AllToAll(tin, tout).ok());
    Busy(60);
  });
  EXPECT_GT(serial, 115);
  // Link time off: the copy alone (4 MB: well under a millisecond).
  c->set_link_time(false);
  const double copy_only = Ms([&] { ASSERT_TRUE(c->AllToAll(tin, tout).ok()); });
  EXPECT_LT(copy_only, 10);
  std::printf(
      "rehearsal hold: alone %.1f ms, issued under 60 ms of compute %.1f ms, blocking "
      "then compute %.1f ms, copy only %.2f ms\n",
      alone, overlapped, serial, copy_only);
  cudaFree(in);
  cudaFree(out);
}

}  // namespace
}  // namespace ithaca
