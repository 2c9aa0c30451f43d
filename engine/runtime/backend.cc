#include "engine/core/units.h"
#include "engine/runtime/backend.h"

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/comm/nccl/nccl_connect.h"

namespace ithaca {

absl::StatusOr<Backend> MakeBackend(const JobSpec& spec, int gpu, int64_t probe_window) {
  Backend b;
  if (spec.backend == "cpu") {
    b.ops = std::make_unique<CpuOps>();
    b.alloc = std::make_unique<HostAllocator>();
    return b;
  }
  if (spec.backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("backend: \"", spec.backend, "\" is unknown"));
  }
  CudaBackendOptions o;
  o.gpu = gpu;
  o.budget_bytes =
      spec.memory.gpu_budget_gib > 0 ? static_cast<size_t>(spec.memory.gpu_budget_gib * kGiB) : 0;
  o.probe_window = probe_window;
  ASSIGN_OR_RETURN(o.attention_forward, ParseAttentionKernel(spec.kernels.attention_forward));
  ASSIGN_OR_RETURN(o.attention_backward, ParseAttentionKernel(spec.kernels.attention_backward));
  LibraryReport libraries;
  if (BuiltWithCuda()) {
    // One that cannot be loaded at all is only reported (attention then uses the own kernel;
    // NCCL fails when a communicator is made).
    libraries = ReportLibraries();
    RETURN_IF_ERROR(libraries.refusal);
  }
  ASSIGN_OR_RETURN(CudaBackend cuda, MakeCudaBackend(o));
  b.alloc = std::move(cuda.alloc);
  b.ops = std::move(cuda.ops);
  b.device_bytes = cuda.device_bytes;
  b.libraries = libraries.line;
  return b;
}

absl::StatusOr<int64_t> DeviceMemoryBytes(const JobSpec& spec, int gpu) {
  if (spec.backend != "cuda") return 0;
  if (const int64_t bytes = CudaDeviceMemoryBytes(gpu >= 0 ? gpu : 0); bytes > 0) return bytes;
  ASSIGN_OR_RETURN(Backend b, MakeBackend(spec, gpu));  // says why there is no GPU to use
  return b.device_bytes;
}

LibraryReport ReportLibraries() {
  return CombineLibraryReports({CudnnVersionReport(), NcclVersionReport()});
}

}  // namespace ithaca
