// The Hopper attention kernel in a build without CUTLASS (bazel/cuda_configure.bzl): never
// supported, so CudaOps' attention forward and backward stay on cuDNN.
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
                                   int64_t, int64_t, int64_t, uint16_t*, float*, cudaStream_t, int,
                                   const int64_t*, int64_t, int64_t) {
  return cudaErrorNotSupported;
}

int64_t HopperAttentionBackwardWorkspace(int64_t, int64_t, int64_t, int64_t) { return 0; }

cudaError_t HopperAttentionBackward(const uint16_t*, const uint16_t*, const uint16_t*,
                                    const uint16_t*, const uint16_t*, const float*, int64_t,
                                    int64_t, int64_t, int64_t, uint16_t*, uint16_t*, uint16_t*,
                                    void*, int64_t, cudaStream_t, const int64_t*, int64_t,
                                    int64_t) {
  return cudaErrorNotSupported;
}

}  // namespace cuda
}  // namespace ithaca
