#include "engine/runtime/backend.h"

#include <cuda_runtime.h>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"

namespace ithaca {

absl::StatusOr<Backend> MakeBackend(const JobSpec& spec, int gpu) {
  Backend b;
  if (spec.backend == "cpu") {
    b.ops = std::make_unique<CpuOps>();
    b.alloc = std::make_unique<HostAllocator>();
    return b;
  }
  if (spec.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("backend: \"", spec.backend, "\" is unknown"));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        "backend: \"cuda\" but this machine has no usable CUDA GPU; use backend = \"cpu\"");
  }
  const int device = gpu >= 0 ? gpu : 0;
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " requested but only ", count, " are visible"));
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cannot use GPU ", device));
  }
  const size_t budget = spec.memory.gpu_budget_gib > 0
                            ? static_cast<size_t>(spec.memory.gpu_budget_gib * (1 << 30))
                            : 0;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    b.device_bytes = static_cast<int64_t>(total_bytes);
  }
  auto alloc = std::make_unique<CudaAllocator>(budget);
  CudaOps::Options opts;
  opts.alloc = alloc.get();
  b.ops = std::make_unique<CudaOps>(opts);
  b.alloc = std::move(alloc);
  return b;
}

}

}  // namespace ithaca
