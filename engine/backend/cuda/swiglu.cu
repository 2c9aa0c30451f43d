// SwiGLU (silu(gate) ⊙ up) and its backward, elementwise in bf16 with f32 math: grid-stride loops
// of 16-byte vectors (8 bf16) where every pointer is 16-byte aligned, with a scalar tail.
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

__global__ void SwiGLUKernel(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                             bool vec) {
  GridStride8(n, vec, [&](auto w, int64_t i) {
    constexpr int kW = decltype(w)::value;
    float g[kW], u[kW], o[kW];
    LoadVec(gate + i, g);
    LoadVec(up + i, u);
#pragma unroll
    for (int e = 0; e < kW; ++e) o[e] = g[e] * Sigmoid(g[e]) * u[e];
    StoreVec(out + i, o);
  });
}

// Each element's inputs are read before its outputs are written (by the same thread): dgate may
// alias gate, dup up.
__global__ void SwiGLUBackwardKernel(const uint16_t* gate, const uint16_t* up, const uint16_t* dout,
                                     uint16_t* dgate, uint16_t* dup, int64_t n, bool vec) {
  GridStride8(n, vec, [&](auto w, int64_t i) {
    constexpr int kW = decltype(w)::value;
    float g[kW], u[kW], go[kW], dg[kW], du[kW];
    LoadVec(gate + i, g);
    LoadVec(up + i, u);
    LoadVec(dout + i, go);
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      const float s = Sigmoid(g[e]);
      dg[e] = go[e] * u[e] * s * (1.f + g[e] * (1.f - s));
      du[e] = go[e] * g[e] * s;
    }
    StoreVec(dgate + i, dg);
    StoreVec(dup + i, du);
  });
}

}  // namespace

void SwiGLUForward(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = Aligned16(gate) && Aligned16(up) && Aligned16(out);
  SwiGLUKernel<<<GridFor(vec ? n / 8 : n, kThreads), kThreads, 0, stream>>>(gate, up, out, n, vec);
  cudaCheckLaunch();
}

void SwiGLUBackward(const uint16_t* gate, const uint16_t* up, const uint16_t* dout, uint16_t* dgate,
                    uint16_t* dup, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec =
      Aligned16(gate) && Aligned16(up) && Aligned16(dout) && Aligned16(dgate) && Aligned16(dup);
  SwiGLUBackwardKernel<<<GridFor(vec ? n / 8 : n, kThreads), kThreads, 0, stream>>>(
      gate, up, dout, dgate, dup, n, vec);
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
