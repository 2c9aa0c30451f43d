#include "worker/backend.h"

#include <unistd.h>

#include <algorithm>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_backend.h"

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
  const size_t budget = spec.memory.gpu_budget_gib > 0
                            ? static_cast<size_t>(spec.memory.gpu_budget_gib * (1 << 30))
                            : 0;
  ASSIGN_OR_RETURN(CudaBackend cuda, MakeCudaBackend(gpu, budget));
  b.alloc = std::move(cuda.alloc);
  b.ops = std::move(cuda.ops);
  b.device_bytes = cuda.device_bytes;
  return b;
}

void UseBackendStreams(const Backend& backend, Comm* comm) {
  UseCudaStreams(backend.ops.get(), comm);
}

void FillMemoryBudgets(const Backend& backend, int ranks_on_host, JobSpec* spec) {
  constexpr double kGiB = double(int64_t{1} << 30);
  if (spec->memory.gpu_budget_gib == 0 && backend.device_bytes > 0) {
    spec->memory.gpu_budget_gib = backend.device_bytes / kGiB - 2.0;
  }
  if (spec->memory.host_budget_gib == 0) {
    const double host = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
    spec->memory.host_budget_gib = 0.85 * host / kGiB / std::max(1, ranks_on_host);
  }
}

}  // namespace ithaca
