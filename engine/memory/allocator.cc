#include "engine/memory/allocator.h"

#include <cstdlib>

namespace ithaca {

absl::StatusOr<void*> HostAllocator::Allocate(size_t bytes, Tier tier) {
  if (limit_ && tracker_.device_current() + bytes > limit_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory: ", bytes, " bytes for tier ", TierName(tier), " with ",
                     tracker_.device_current(), " of ", limit_, " in use"));
  }
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host allocation of ", bytes, " bytes for tier ", TierName(tier), " failed"));
  }
  tracker_.OnAlloc(tier, bytes);
  return p;
}

void HostAllocator::Free(void* ptr, size_t bytes, Tier tier) {
  std::free(ptr);
  tracker_.OnFree(tier, bytes);
}

absl::StatusOr<Buffer> Buffer::Make(Allocator* alloc, DType dtype, Shape shape, Tier tier) {
  Buffer b;
  size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  ASSIGN_OR_RETURN(void* p, alloc->Allocate(bytes, tier));
  b.alloc_ = alloc;
  b.view_ = Tensor(p, dtype, std::move(shape), alloc->device());
  b.bytes_ = bytes;
  b.tier_ = tier;
  return b;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Reset();
    alloc_ = o.alloc_;
    view_ = o.view_;
    bytes_ = o.bytes_;
    tier_ = o.tier_;
    o.alloc_ = nullptr;
    o.view_ = Tensor();
    o.bytes_ = 0;
  }
  return *this;
}

void Buffer::Reset() {
  if (alloc_ && view_.data) alloc_->Free(view_.data, bytes_, tier_);
  alloc_ = nullptr;
  view_ = Tensor();
  bytes_ = 0;
}

void Buffer::ResetUncached() {
  if (alloc_ && view_.data) alloc_->FreeUncached(view_.data, bytes_, tier_);
  alloc_ = nullptr;
  view_ = Tensor();
  bytes_ = 0;
}

size_t SizeClassCache::SizeClass(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSplit = size_t{1} << 20;
  if (bytes == 0) bytes = 1;
  const size_t g = bytes <= kSplit ? kSmall : kLarge;
  return (bytes + g - 1) / g * g;
}

void SizeClassCache::OnAlloc(size_t bytes) {
  int64_t& free_blocks = cached_[SizeClass(bytes)];
  if (free_blocks > 0) {
    --free_blocks;
  } else {
    reserved_ += static_cast<int64_t>(SizeClass(bytes));
  }
}

void SizeClassCache::OnFree(size_t bytes) { ++cached_[SizeClass(bytes)]; }

}  // namespace ithaca
