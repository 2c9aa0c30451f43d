// Allocators tag each allocation with a tier; Buffer owns one allocation and views it as a Tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "engine/core/tensor.h"
#include "engine/memory/tiers.h"

namespace ithaca {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Returns nullptr-free memory or an error (RESOURCE_EXHAUSTED names the tier and size).
  virtual absl::StatusOr<void*> Allocate(size_t bytes, Tier tier) = 0;
  virtual void Free(void* ptr, size_t bytes, Tier tier) = 0;
  // Free, but the memory goes back to the system now instead of into a cache: for one-off sizes
  // that no later request shares (a library's plan-timing workspace), which a caching allocator
  // would otherwise hold for the rest of the process.
  virtual void FreeUncached(void* ptr, size_t bytes, Tier tier) { Free(ptr, bytes, tier); }
  MemoryTracker& tracker() { return tracker_; }
  const MemoryTracker& tracker() const { return tracker_; }

 protected:
  MemoryTracker tracker_;
};

// The caching rule of the CUDA allocator (engine/backend/cuda/cuda_allocator.h), without memory:
// a request is rounded up to its size class, a freed block is kept in its class and handed out
// again, so what the allocator holds from CUDA is, per class, the most blocks ever live at once.
// The planner replays a step through it to predict that (MemoryPlan::device_reserved).
class SizeClassCache {
 public:
  // 512-byte granules up to 1 MiB, 2 MiB granules above.
  static size_t SizeClass(size_t bytes);
  void OnAlloc(size_t bytes);
  void OnFree(size_t bytes);
  int64_t reserved() const { return reserved_; }

 private:
  std::unordered_map<size_t, int64_t> cached_;  // size class -> blocks free in it
  int64_t reserved_ = 0;
};

// Host memory from the C heap (64-byte aligned), optionally capped so tests can force
// out-of-memory errors.
class HostAllocator : public Allocator {
 public:
  explicit HostAllocator(size_t limit_bytes = 0) : limit_(limit_bytes) {}
  Device device() const override { return Device::kCpu; }
  absl::StatusOr<void*> Allocate(size_t bytes, Tier tier) override;
  void Free(void* ptr, size_t bytes, Tier tier) override;

 private:
  size_t limit_;
};

// One allocation, freed on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  static absl::StatusOr<Buffer> Make(Allocator* alloc, DType dtype, Shape shape, Tier tier);
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void Reset();
  // Reset through Allocator::FreeUncached.
  void ResetUncached();
  const Tensor& tensor() const { return view_; }
  Tensor& tensor() { return view_; }
  bool empty() const { return view_.data == nullptr; }
  Tier tier() const { return tier_; }

 private:
  Allocator* alloc_ = nullptr;
  Tensor view_;
  size_t bytes_ = 0;
  Tier tier_ = Tier::kActivations;
};

}  // namespace ithaca
