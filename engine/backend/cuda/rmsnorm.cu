// RMSNorm kernels and their launchers.
#include <cuda_bf16.h>

#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/rmsnorm.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One block per row: a strided sum of squares, a block reduction, then the scaled write.
__global__ void RmsNormForwardKernel(const __nv_bfloat16* __restrict__ x,
                                     const __nv_bfloat16* __restrict__ w, float eps, int64_t d,
                                     __nv_bfloat16* __restrict__ out, float* __restrict__ rstd) {
  const int64_t row = blockIdx.x;
  const __nv_bfloat16* xr = x + row * d;
  float sq = 0.f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = __bfloat162float(xr[i]);
    sq += v * v;
  }
  for (int off = 16; off > 0; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sq;
  __syncthreads();
  __shared__ float row_rstd;
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int i = 0; i < kThreads / 32; ++i) total += warp_sums[i];
    row_rstd = rsqrtf(total / static_cast<float>(d) + eps);
    rstd[row] = row_rstd;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    out[row * d + i] = __float2bfloat16(__bfloat162float(xr[i]) * row_rstd * __bfloat162float(w[i]));
  }
}

}  // namespace

void RmsNormForward(const uint16_t* x, const uint16_t* w, float eps, int64_t rows, int64_t d,
                    uint16_t* out, float* rstd, cudaStream_t stream) {
  if (rows == 0) return;
  RmsNormForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat16*>(x), reinterpret_cast<const __nv_bfloat16*>(w), eps, d,
      reinterpret_cast<__nv_bfloat16*>(out), rstd);
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
