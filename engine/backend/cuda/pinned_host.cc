#include "engine/backend/cuda/pinned_host.h"

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ithaca {
namespace {

// Writes a zero into every page of [p, p + bytes), `threads` ranges at once: the kernel faults
// the pages in (huge ones where it can) on every core instead of in cudaHostRegister's one walk.
void TouchPages(char* p, size_t bytes, int threads) {
  constexpr size_t kPage = 4096;
  const size_t per = (bytes / threads + kPage - 1) / kPage * kPage;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const size_t lo = std::min(bytes, t * per), hi = std::min(bytes, lo + per);
    if (lo >= hi) break;
    pool.emplace_back([p, lo, hi] {
      for (size_t off = lo; off < hi; off += kPage) p[off] = 0;
    });
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace

absl::StatusOr<void*> AllocatePinnedHost(size_t bytes, PinMethod method, int threads) {
  if (method == PinMethod::kHostAlloc) {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaHostAlloc of ", bytes, " bytes failed: ", cudaGetErrorString(err)));
    }
    return p;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of ", bytes, " bytes for pinned host memory failed: ", strerror(errno)));
  }
  madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without huge pages it still works
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  TouchPages(static_cast<char*>(p), bytes, threads);
  const cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (err != cudaSuccess) {
    cudaGetLastError();
    munmap(p, bytes);
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaHostRegister of ", bytes, " bytes failed: ", cudaGetErrorString(err),
                     " (the locked-memory limit, ulimit -l, or the host's free memory)"));
  }
  return p;
}

void FreePinnedHost(void* p, size_t bytes, PinMethod method) {
  if (p == nullptr) return;
  if (method == PinMethod::kHostAlloc) {
    cudaFreeHost(p);
    return;
  }
  cudaHostUnregister(p);
  munmap(p, bytes);
}

}  // namespace ithaca
