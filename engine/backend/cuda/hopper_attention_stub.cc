// The Hopper attention kernel in a build without CUTLASS (bazel/cuda_configure.bzl): never
// supported, so CudaOps::Attention stays on cuDNN.
#include "engine/backend/cuda/hopper_attention.h"

namespace ithaca {
namespace cuda {

bool HopperAttentionBuilt() { return false; }

bool HopperAttentionDeviceSupported() { return false; }

const char* HopperAttentionUnsupported(int64_t, int64_t, int64_t, int64_t, const void*, const void*,
                                       const void*, const void*, const float*) {
  return "built without CUTLASS";
}

int HopperAttentionClusterSize(int64_t, int64_t, int64_t, int64_t) { return 1; }

cudaError_t HopperAttentionForward(const uint16_t*, const uint16_t*, const uint16_t*, int64_t,
                                   int64_t, int64_t, int64_t, uint16_t*, float*, cudaStream_t,
                                   int) {
  return cudaErrorNotSupported;
}

}  // namespace cuda
}  // namespace ithaca
