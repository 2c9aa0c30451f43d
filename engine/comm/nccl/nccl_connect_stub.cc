// nccl_connect.h in a build without CUDA (bazel/cuda_configure.bzl found none).
#include "engine/comm/nccl/nccl_connect.h"

namespace ithaca {
namespace {

absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "NCCL: this binary was built without CUDA (ITHACA_CUDA=none or no toolkit found at build "
      "time); use backend = \"cpu\" (Gloo) or rebuild with CUDA");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Comm>> ConnectNccl(int, int, const std::string&, int, double) {
  return NoCuda();
}

absl::StatusOr<std::string> NcclVersionReport() { return NoCuda(); }

}  // namespace ithaca
