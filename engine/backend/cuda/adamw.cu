// AdamW on f32 master weights, writing the bf16 (or f32) working copy in the same pass.
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// PyTorch's AdamW, as cpu::AdamW: p ← p(1 − lr·wd); m, v moments; p ← p − step·m/(√v/√bc2 + ε).
// Every operation is rounded on its own (the _rn intrinsics: no fused multiply-add, IEEE division
// and square root), in cpu::AdamW's order, so the result is the CPU's bit for bit: optimizer
// state on the host (engine/train/host_adamw.h) then trains exactly as state on the device.
template <typename G, typename W>
__global__ void AdamWKernel(float* master, const G* grad, float* m, float* v, W* working, int64_t n,
                            AdamWArgs a) {
  const float decay = __fsub_rn(1.f, __fmul_rn(a.lr, a.weight_decay));
  const float omb1 = __fsub_rn(1.f, a.beta1), omb2 = __fsub_rn(1.f, a.beta2);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = __fmul_rn(Load(grad, i), a.grad_scale);
    float w = __fmul_rn(master[i], decay);
    const float mi = __fadd_rn(__fmul_rn(a.beta1, m[i]), __fmul_rn(omb1, g));
    const float vi = __fadd_rn(__fmul_rn(a.beta2, v[i]), __fmul_rn(__fmul_rn(omb2, g), g));
    const float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), a.inv_sqrt_bc2), a.eps);
    w = __fsub_rn(w, __fdiv_rn(__fmul_rn(a.step_size, mi), den));
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
