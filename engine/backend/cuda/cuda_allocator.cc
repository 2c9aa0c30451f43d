// CudaAllocator: exact-size-class caching over cudaMalloc and pinned host memory (pinned_host.h).
#include "engine/backend/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include "engine/backend/cuda/pinned_host.h"

#include <cstdio>

namespace ithaca {
namespace {

// How a host block of size class `cls` is pinned: the big ones (the optimizer's state, the
// parameters on the host, offloaded block inputs) by mmap + parallel touch + cudaHostRegister.
PinMethod PinMethodFor(size_t cls) {
  return cls >= kRegisterPinMinBytes ? PinMethod::kRegister : PinMethod::kHostAlloc;
}

// One block from CUDA: device memory, or pinned host memory. The error says what failed
// (cudaMalloc's error, or pinned_host.h's: cudaHostAlloc, mmap or cudaHostRegister, and why).
absl::StatusOr<void*> Obtain(size_t cls, bool host) {
  if (host) return AllocatePinnedHost(cls, PinMethodFor(cls));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, cls);
  if (err == cudaSuccess) return p;
  cudaGetLastError();
  return absl::ResourceExhaustedError(cudaGetErrorString(err));
}

void GiveBack(void* p, size_t cls, bool host) {
  if (host) {
    FreePinnedHost(p, cls, PinMethodFor(cls));
  } else {
    cudaFree(p);
  }
}

}  // namespace

size_t CudaAllocator::RoundUp(size_t bytes) { return SizeClassCache::SizeClass(bytes); }

CudaAllocator::~CudaAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!device_.live.empty() || !host_.live.empty()) {
    std::fprintf(stderr, "CudaAllocator: destroyed with %zu device and %zu host blocks live\n",
                 device_.live.size(), host_.live.size());
  }
  ReleasePool(device_, false);
  ReleasePool(host_, true);
}

absl::StatusOr<void*> CudaAllocator::Allocate(size_t bytes, Tier tier) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool host = !IsDeviceTier(tier);
  if (!host && limit_ && tracker_.device_current() + bytes > limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of GPU memory: ", bytes, " bytes for tier ", TierName(tier), " with ",
                     tracker_.device_current(), " of ", limit_, " in use"));
  }
  ASSIGN_OR_RETURN(void* p, AllocateFrom(host ? host_ : device_, host, bytes, tier));
  tracker_.OnAlloc(tier, bytes);
  return p;
}

absl::StatusOr<void*> CudaAllocator::AllocateFrom(Pool& pool, bool host, size_t bytes, Tier tier) {
  const size_t cls = RoundUp(bytes);
  auto it = pool.free.find(cls);
  if (it != pool.free.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    pool.live.emplace(p, cls);
    return p;
  }
  absl::StatusOr<void*> got = Obtain(cls, host);
  if (!got.ok()) {
    // Out of memory with blocks cached in other size classes: give them back and retry once.
    ReleasePool(pool, host);
    got = Obtain(cls, host);
  }
  if (!got.ok()) {
    size_t free_b = 0, total_b = 0;
    if (!host) cudaMemGetInfo(&free_b, &total_b);
    return absl::ResourceExhaustedError(absl::StrCat(
        host ? "pinned host" : "GPU", " allocation of ", bytes, " bytes for tier ", TierName(tier),
        " failed: ", got.status().message(), "; ", pool.reserved, " bytes reserved",
        host ? "" : absl::StrCat(", ", free_b, " of ", total_b, " free")));
  }
  void* p = *got;
  pool.reserved += static_cast<int64_t>(cls);
  ++pool.mallocs;
  pool.live.emplace(p, cls);
  return p;
}

void CudaAllocator::Free(void* ptr, size_t bytes, Tier tier) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  Pool& pool = IsDeviceTier(tier) ? device_ : host_;
  auto it = pool.live.find(ptr);
  if (it == pool.live.end()) {
    std::fprintf(stderr, "CudaAllocator::Free: %p was not allocated here (tier %s)\n", ptr,
                 TierName(tier));
    std::abort();
  }
  // Work already enqueued on the compute stream may still read the block; the next user is
  // enqueued after it on the same stream, so reuse is ordered. Other streams must sync first.
  pool.free[it->second].push_back(ptr);
  pool.live.erase(it);
  tracker_.OnFree(tier, bytes);
}

void CudaAllocator::FreeUncached(void* ptr, size_t bytes, Tier tier) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  const bool host = !IsDeviceTier(tier);
  Pool& pool = host ? host_ : device_;
  auto it = pool.live.find(ptr);
  if (it == pool.live.end()) {
    std::fprintf(stderr, "CudaAllocator::FreeUncached: %p was not allocated here (tier %s)\n", ptr,
                 TierName(tier));
    std::abort();
  }
  cudaDeviceSynchronize();
  GiveBack(ptr, it->second, host);
  pool.reserved -= static_cast<int64_t>(it->second);
  pool.live.erase(it);
  tracker_.OnFree(tier, bytes);
}

void CudaAllocator::ReleasePool(Pool& pool, bool host) {
  bool any = false;
  for (auto& [cls, blocks] : pool.free) any |= !blocks.empty();
  if (!any) return;
  cudaDeviceSynchronize();
  for (auto& [cls, blocks] : pool.free) {
    for (void* p : blocks) {
      GiveBack(p, cls, host);
      pool.reserved -= static_cast<int64_t>(cls);
    }
    blocks.clear();
  }
}

CudaAllocator::Stats CudaAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.device_reserved = device_.reserved;
  s.host_reserved = host_.reserved;
  s.device_mallocs = device_.mallocs;
  s.host_mallocs = host_.mallocs;
  return s;
}

}  // namespace ithaca
