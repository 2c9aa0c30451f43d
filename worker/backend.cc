#include "worker/backend.h"

#include "engine/backend/cpu/cpu_ops.h"

namespace ithaca {

absl::StatusOr<Backend> MakeBackend(const JobSpec& spec, int gpu) {
  (void)gpu;
  if (spec.backend == "cpu") {
    Backend b;
    b.ops = std::make_unique<CpuOps>();
    b.alloc = std::make_unique<HostAllocator>();
    return b;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("backend: \"", spec.backend, "\" is not available in this build"));
}

}  // namespace ithaca
