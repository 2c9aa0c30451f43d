// SwiGLU (silu(gate) ⊙ up) and its backward, elementwise in bf16 with f32 math.
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void SwiGLUKernel(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = Bf(gate[i]), u = Bf(up[i]);
    out[i] = ToBf(g * Sigmoid(g) * u);
  }
}

// Each element's inputs are read before its outputs are written: dgate may alias gate, dup up.
__global__ void SwiGLUBackwardKernel(const uint16_t* gate, const uint16_t* up, const uint16_t* dout,
                                     uint16_t* dgate, uint16_t* dup, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = Bf(gate[i]), u = Bf(up[i]), go = Bf(dout[i]);
    const float s = Sigmoid(g);
    dgate[i] = ToBf(go * u * s * (1.f + g * (1.f - s)));
    dup[i] = ToBf(go * g * s);
  }
}

}  // namespace

void SwiGLUForward(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  SwiGLUKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(gate, up, out, n);
  cudaCheckLaunch();
}

void SwiGLUBackward(const uint16_t* gate, const uint16_t* up, const uint16_t* dout, uint16_t* dgate,
                    uint16_t* dup, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  SwiGLUBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(gate, up, dout, dgate, dup,
                                                                      n);
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
