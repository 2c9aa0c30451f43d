// AdamW on f32 master weights, writing the bf16 (or f32) working copy in the same pass.
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// PyTorch's AdamW, as cpu::AdamW: p ← p(1 − lr·wd); m, v moments; p ← p − step·m/(√v/√bc2 + ε).
template <typename G, typename W>
__global__ void AdamWKernel(float* master, const G* grad, float* m, float* v, W* working, int64_t n,
                            AdamWArgs a) {
  const float decay = 1.f - a.lr * a.weight_decay;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = Load(grad, i) * a.grad_scale;
    float w = master[i] * decay;
    const float mi = a.beta1 * m[i] + (1.f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.f - a.beta2) * g * g;
    w -= a.step_size * mi / (sqrtf(vi) * a.inv_sqrt_bc2 + a.eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = w;
    if (working != nullptr) Store(working, i, w);
  }
}

template <typename G>
void Launch(float* master, const G* grad, float* m, float* v, void* working, ElemType wt, int64_t n,
            const AdamWArgs& a, cudaStream_t stream) {
  const unsigned grid = GridFor(n, kThreads);
  if (wt == ElemType::kBF16) {
    AdamWKernel<<<grid, kThreads, 0, stream>>>(master, grad, m, v, static_cast<uint16_t*>(working),
                                               n, a);
  } else {
    AdamWKernel<<<grid, kThreads, 0, stream>>>(master, grad, m, v, static_cast<float*>(working), n,
                                               a);
  }
}

}  // namespace

void AdamW(float* master, const void* grad, ElemType gt, float* m, float* v, void* working,
           ElemType wt, int64_t n, const AdamWArgs& a, cudaStream_t stream) {
  if (n == 0) return;
  if (gt == ElemType::kBF16) {
    Launch(master, static_cast<const uint16_t*>(grad), m, v, working, wt, n, a, stream);
  } else {
    Launch(master, static_cast<const float*>(grad), m, v, working, wt, n, a, stream);
  }
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
