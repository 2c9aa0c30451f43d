#include "engine/plan/meta.h"

#include <cstring>

namespace ithaca {

void MetaOps::Download(const Tensor& src, void* host, DType host_dtype) {
  // Host-side readers (gathers for checkpoints) see zeros.
  std::memset(host, 0, src.numel() * DTypeSize(host_dtype));
}

absl::StatusOr<void*> MetaAllocator::Allocate(size_t bytes, Tier tier) {
  // The replay allocates throughout (every tile, stage and block), so this is where a long one
  // stops.
  if (++allocations_ % 256 == 0) {
    if (limits_.cancelled && limits_.cancelled()) {
      return absl::CancelledError("planning stopped: the client went away");
    }
    if (absl::Now() > limits_.deadline) {
      return absl::DeadlineExceededError("planning ran past its time bound");
    }
  }
  void* p = reinterpret_cast<void*>(next_);
  next_ += (bytes + 255) / 256 * 256 + 256;
  tracker_.OnAlloc(tier, bytes);
  if (IsDeviceTier(tier)) device_cache_.OnAlloc(bytes);
  return p;
}

void MetaAllocator::Free(void* ptr, size_t bytes, Tier tier) {
  (void)ptr;
  tracker_.OnFree(tier, bytes);
  if (IsDeviceTier(tier)) device_cache_.OnFree(bytes);
}

absl::StatusOr<std::unique_ptr<Comm>> MetaComm::Split(int color, int key) {
  (void)color;
  (void)key;
  return std::unique_ptr<Comm>(new MetaComm(rank_ % split_size_, split_size_));
}

}  // namespace ithaca
