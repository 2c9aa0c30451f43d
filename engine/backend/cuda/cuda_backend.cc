#include "engine/backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>
#include <cudnn_version.h>

#include "absl/strings/str_cat.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/cudnn_attention.h"
#include "engine/core/library_version.h"

namespace ithaca {

bool BuiltWithCuda() { return true; }

absl::StatusOr<CudaBackend> MakeCudaBackend(const CudaBackendOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        "backend: \"cuda\" but this machine has no usable CUDA GPU; use backend = \"cpu\"");
  }
  const int device = options.gpu >= 0 ? options.gpu : 0;
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " requested but only ", count, " are visible"));
  }
  if (cudaSetDevice(device) != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cannot use GPU ", device));
  }
  CudaBackend b;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    b.device_bytes = static_cast<int64_t>(total_bytes);
  }
  auto alloc = std::make_unique<CudaAllocator>(options.budget_bytes);
  CudaOps::Options opts;
  opts.alloc = alloc.get();
  opts.probe_window = options.probe_window;
  opts.attention_forward = options.attention_forward;
  opts.attention_backward = options.attention_backward;
  b.ops = std::make_unique<CudaOps>(opts);
  if (!b.ops->status().ok()) {
    const absl::Status st = b.ops->status();
    b.ops.reset();  // its buffers go back to `alloc` before it is freed
    return st;
  }
  b.alloc = std::move(alloc);
  return b;
}

int64_t CudaDeviceMemoryBytes(int gpu) {
  int count = 0;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || gpu < 0 || gpu >= count ||
      cudaSetDevice(gpu) != cudaSuccess ||
      cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    return 0;
  }
  return static_cast<int64_t>(total_bytes);
}

absl::StatusOr<std::string> CudnnVersionReport() {
  return CheckLibraryVersion("cuDNN", CUDNN_VERSION, cuda::CudnnAttention::RuntimeVersion(),
                             kMinCudnnVersion);
}

}  // namespace ithaca
