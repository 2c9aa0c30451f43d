// CudaAllocator: a tier-tagged caching allocator over cudaMalloc (device tiers) and pinned host
// memory (the host tiers; pinned_host.h: blocks from 256 MiB by mmap + cudaHostRegister, smaller
// ones by cudaHostAlloc). Freed blocks go to per-size-class free lists
// and are handed out again, so a steady-state training step calls neither cudaMalloc nor
// cudaFree. The tracker counts requested bytes per tier, as HostAllocator does; reserved bytes
// (what the pools hold from CUDA) are reported separately.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/memory/allocator.h"

namespace ithaca {

class CudaAllocator : public Allocator {
 public:
  // `device_limit_bytes` > 0 caps device bytes in use (tests force out-of-memory with it).
  explicit CudaAllocator(size_t device_limit_bytes = 0) : limit_(device_limit_bytes) {}
  ~CudaAllocator() override;
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  Device device() const override { return Device::kCuda; }
  absl::StatusOr<void*> Allocate(size_t bytes, Tier tier) override;
  void Free(void* ptr, size_t bytes, Tier tier) override;
  // cudaFree / cudaFreeHost now (after a device synchronize: work enqueued on any stream may
  // still read the block).
  void FreeUncached(void* ptr, size_t bytes, Tier tier) override;

  struct Stats {
    int64_t device_reserved = 0, host_reserved = 0;  // bytes obtained from CUDA, in use or cached
    int64_t device_mallocs = 0, host_mallocs = 0;    // blocks obtained from CUDA
  };
  Stats stats() const;

  // The size class of a request (SizeClassCache::SizeClass, which the planner replays).
  static size_t RoundUp(size_t bytes);

 private:
  struct Pool {
    std::map<size_t, std::vector<void*>> free;  // size class -> cached blocks
    std::unordered_map<void*, size_t> live;     // block -> its size class
    int64_t reserved = 0, mallocs = 0;
  };
  absl::StatusOr<void*> AllocateFrom(Pool& pool, bool host, size_t bytes, Tier tier);
  void ReleasePool(Pool& pool, bool host);

  size_t limit_;
  mutable std::mutex mu_;
  Pool device_, host_;
};

}  // namespace ithaca
