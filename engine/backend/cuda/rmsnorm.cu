// RMSNorm kernels and their launchers.
#include <cuda_bf16.h>

#include "engine/backend/cuda/bf16_util.cuh"
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
    out[row * d + i] =
        __float2bfloat16(__bfloat162float(xr[i]) * row_rstd * __bfloat162float(w[i]));
  }
}

constexpr int kBackwardRows = 16;  // rows per block: dw partials are summed over them first

// dx[r] += rstd·(g ⊙ w − x · rstd² / d · Σ g w x)  (accumulated, bf16);
// dw += Σ_r g ⊙ x · rstd  (f32, per-block partials in shared memory, then one atomic per column).
__global__ void RmsNormBackwardKernel(const uint16_t* __restrict__ x,
                                      const uint16_t* __restrict__ w,
                                      const float* __restrict__ rstd,
                                      const uint16_t* __restrict__ dout, int64_t rows, int64_t d,
                                      uint16_t* __restrict__ dx, float* __restrict__ dw) {
  extern __shared__ float dw_partial[];
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dw_partial[i] = 0.f;
  const int64_t r0 = blockIdx.x * int64_t(kBackwardRows);
  const int64_t r1 = min(rows, r0 + kBackwardRows);
  for (int64_t r = r0; r < r1; ++r) {
    const uint16_t* xr = x + r * d;
    const uint16_t* gr = dout + r * d;
    float dot = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dot += Bf(gr[i]) * Bf(w[i]) * Bf(xr[i]);
    dot = BlockSum(dot);
    const float rs = rstd[r];
    const float c = dot / static_cast<float>(d) * rs * rs;
    uint16_t* dxr = dx + r * d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float xv = Bf(xr[i]), g = Bf(gr[i]);
      dxr[i] = ToBf(Bf(dxr[i]) + rs * (g * Bf(w[i]) - xv * c));
      dw_partial[i] += g * xv * rs;  // column i is only ever touched by this thread
    }
  }
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) atomicAdd(dw + i, dw_partial[i]);
}

}  // namespace

void RmsNormBackward(const uint16_t* x, const uint16_t* w, const float* rstd, const uint16_t* dout,
                     int64_t rows, int64_t d, uint16_t* dx, float* dw, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  const size_t smem = static_cast<size_t>(d) * sizeof(float);
  if (smem > 48 * 1024) {
    std::fprintf(stderr, "RmsNormBackward: d = %lld exceeds the 12288 the kernel supports\n",
                 static_cast<long long>(d));
    std::abort();
  }
  const unsigned grid = static_cast<unsigned>((rows + kBackwardRows - 1) / kBackwardRows);
  RmsNormBackwardKernel<<<grid, kThreads, smem, stream>>>(x, w, rstd, dout, rows, d, dx, dw);
  cudaCheckLaunch();
}

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
