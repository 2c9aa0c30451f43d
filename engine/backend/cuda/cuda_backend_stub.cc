// cuda_backend.h in a build without CUDA (bazel/cuda_configure.bzl found none).
#include "engine/backend/cuda/cuda_backend.h"

namespace ithaca {
namespace {

absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "backend: \"cuda\" but this binary was built without CUDA (ITHACA_CUDA=none or no "
      "toolkit found at build time); use backend = \"cpu\" or rebuild with CUDA");
}

}  // namespace

bool BuiltWithCuda() { return false; }

absl::StatusOr<CudaBackend> MakeCudaBackend(const CudaBackendOptions&) { return NoCuda(); }

int64_t CudaDeviceMemoryBytes(int) { return 0; }

absl::StatusOr<std::string> CudnnVersionReport() { return NoCuda(); }

}  // namespace ithaca
