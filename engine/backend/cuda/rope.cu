// Rotary position embedding, in place, Hugging Face's rotate_half convention.
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (token, head, i < D/2) pair. The angle is float(pos) · inv_freq[i] in f32, as
// Hugging Face computes it; sincosf (not __sincosf) keeps it exact at large positions.
__global__ void RopeKernel(uint16_t* x, int64_t tokens, int64_t heads, int64_t half, int64_t pos0,
                           const float* inv_freq, float sign) {
  const int64_t n = tokens * heads * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t th = idx / half;  // token · heads + head
    const int64_t t = th / heads;
    const float angle = static_cast<float>(pos0 + t) * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    s *= sign;
    uint16_t* lo = x + th * 2 * half;
    const float a = Bf(lo[i]), b = Bf(lo[i + half]);
    lo[i] = ToBf(a * c - b * s);
    lo[i + half] = ToBf(b * c + a * s);
  }
}

}  // namespace

void Rope(uint16_t* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t pos0,
          const float* inv_freq, bool inverse, cudaStream_t stream) {
  const int64_t n = tokens * heads * (head_dim / 2);
  if (n == 0) return;
  RopeKernel<<<GridFor(n, kThreads), kThreads, 0, stream>>>(x, tokens, heads, head_dim / 2, pos0,
                                                            inv_freq, inverse ? -1.f : 1.f);
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
