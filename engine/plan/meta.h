// The "meta device": an Ops that computes nothing, an allocator that hands out addresses without
// memory, and a Comm that moves nothing. Running the real training schedule on them replays every
// allocation the schedule makes, in order and at full size, in microseconds: that is how the
// planner predicts per-tier peaks without a GPU, and why it cannot drift from the code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backend/ops.h"
#include "engine/comm/comm.h"
#include "engine/memory/allocator.h"

namespace ithaca {

class MetaOps final : public Ops {
 public:
  explicit MetaOps(Device device, DType act) : device_(device), act_(act) {}
  Device device() const override { return device_; }
  DType act_dtype() const override { return act_; }
  double PeakFlops() const override { return 0; }
  void Fill(const Tensor&, float) override {}
  void Copy(const Tensor&, const Tensor&) override {}
  void Copy2D(const Tensor&, int64_t, const Tensor&, int64_t, int64_t, int64_t) override {}
  void Upload(const void*, DType, const Tensor&) override {}
  void Download(const Tensor& src, void* host, DType host_dtype) override;
  void Axpy(float, const Tensor&, const Tensor&) override {}
  double SumSquares(const Tensor&) override { return 0; }
  double Sum(const Tensor&) override { return 0; }
  void SumSquaresInto(const Tensor&, const Tensor&) override {}
  void SumInto(const Tensor&, const Tensor&) override {}
  void Gemm(const Tensor&, bool, const Tensor&, bool, const Tensor&, float, float) override {}
  void GemmBias(const Tensor&, bool, const Tensor&, bool, const Tensor&, const Tensor&, float,
                float) override {}
  void Embedding(const Tensor&, const Tensor&, const Tensor&) override {}
  void EmbeddingBackward(const Tensor&, const Tensor&, const Tensor&) override {}
  void RmsNorm(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&) override {}
  void RmsNormBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&) override {}
  void RmsNormBackwardInPlace(const Tensor&, const Tensor&, float, const Tensor&,
                              const Tensor&) override {}
  void Rope(const Tensor&, int64_t, const Tensor&, bool, const DocumentMask&) override {}
  void Attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 const DocumentMask&) override {}
  void AttentionBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const DocumentMask&) override {}
  void SwiGLU(const Tensor&, const Tensor&, const Tensor&) override {}
  void SwiGLUBackward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&) override {}
  void CrossEntropy(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) override {}
  void LabelIsArgmax(const Tensor&, const Tensor&, const Tensor&) override {}
  void AdamW(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
             const AdamWParams&) override {}

 private:
  Device device_;
  DType act_;
};

// Addresses from a private range, never backed by memory; tracks tiers like a real allocator.
// How long a replay may run and whether to stop it: its caller's (a daemon stops planning when
// the client goes, and bounds its CPU per plan).
struct PlanLimits {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled;  // unset: never
};

class MetaAllocator final : public Allocator {
 public:
  explicit MetaAllocator(Device device, PlanLimits limits = {})
      : device_(device), limits_(std::move(limits)) {}
  Device device() const override { return device_; }
  absl::StatusOr<void*> Allocate(size_t bytes, Tier tier) override;
  void Free(void* ptr, size_t bytes, Tier tier) override;
  // What the CUDA caching allocator would hold from the device after the same requests.
  int64_t device_reserved() const { return device_cache_.reserved(); }

 private:
  Device device_;
  PlanLimits limits_;
  int64_t allocations_ = 0;  // the limits are looked at every 256th
  uintptr_t next_ = uintptr_t{1} << 44;
  SizeClassCache device_cache_;
};

// A communicator of `size` ranks seen from `rank`: collectives do nothing.
class MetaComm final : public Comm {
 public:
  MetaComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllGather(const Tensor&, const Tensor&) override { return absl::OkStatus(); }
  absl::Status ReduceScatter(const Tensor&, const Tensor&) override { return absl::OkStatus(); }
  absl::Status AllToAll(const Tensor&, const Tensor&) override { return absl::OkStatus(); }
  absl::Status AllReduce(const Tensor&) override { return absl::OkStatus(); }
  absl::Status Broadcast(const Tensor&, int) override { return absl::OkStatus(); }
  absl::Status Barrier() override { return absl::OkStatus(); }
  // Groups of consecutive ranks, as the trainer splits them (color = rank / group size).
  absl::StatusOr<std::unique_ptr<Comm>> Split(int color, int key) override;
  void set_split_size(int n) { split_size_ = n; }

 private:
  int rank_, size_, split_size_ = 1;
};

}  // namespace ithaca
