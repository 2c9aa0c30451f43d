// Pinned (page-locked) host memory, two ways:
//  - kHostAlloc: cudaHostAlloc, which faults in and pins every 4 KiB page on one thread. Measured
//    on the H200 host: 96 GB in 64 s (1.5 GB/s), most of an 8B job's start-up.
//  - kRegister: an anonymous mmap with transparent huge pages asked for (MADV_HUGEPAGE), its pages
//    faulted in (and so zeroed) by every core at once, then one cudaHostRegister of the whole
//    block, which pins pages that are already there (bench/kernels/pin_bench.cc compares them).
// Either way the block is zeroed, and one registration covers the whole block, so a copy that
// spans it is a pinned copy.
#pragma once

#include <cstddef>

#include "engine/core/status.h"

namespace ithaca {

enum class PinMethod { kHostAlloc, kRegister };

// Blocks from this size up are pinned by kRegister in CudaAllocator (below it the mmap, the
// threads and the registration cost more than cudaHostAlloc's page walk saves).
inline constexpr size_t kRegisterPinMinBytes = size_t{256} << 20;

// `bytes` of zeroed pinned host memory; `threads` (0: every core) fault in kRegister's pages.
// RESOURCE_EXHAUSTED naming the method and CUDA's error.
absl::StatusOr<void*> AllocatePinnedHost(size_t bytes, PinMethod method, int threads = 0);
// Gives back a block of AllocatePinnedHost with the same bytes and method.
void FreePinnedHost(void* p, size_t bytes, PinMethod method);

}  // namespace ithaca
