// Rotary position embedding, in place, Hugging Face's rotate_half convention.
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/documents.cuh"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (token, group of kW pair indices i): the angle depends on the token and i but
// not on the head, so the thread computes its kW sines and cosines once and rotates the pairs
// (i, i + D/2) of every head. kW = 8 moves 16-byte vectors (half % 8 == 0, x 16-byte aligned);
// kW = 1 is the scalar fallback. The angle is float(pos) · inv_freq[i] in f32, as Hugging Face
// computes it; sincosf (not __sincosf) keeps it exact at large positions. With documents
// (num_docs > 0) the position counts from the start of the token's document.
template <int kW>
__global__ void RopeKernel(uint16_t* x, int64_t tokens, int64_t heads, int64_t half, int64_t pos0,
                           const float* inv_freq, float sign, const int64_t* starts,
                           int64_t num_docs) {
  const int64_t groups = half / kW, n = tokens * groups;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i0 = (idx % groups) * kW;
    const int64_t t = idx / groups;
    const float pos = static_cast<float>(pos0 + t - DocStart(starts, num_docs, pos0 + t));
    float s[kW], c[kW];
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      sincosf(pos * inv_freq[i0 + e], &s[e], &c[e]);
      s[e] *= sign;
    }
    uint16_t* lo = x + t * heads * 2 * half + i0;
    for (int64_t h = 0; h < heads; ++h, lo += 2 * half) {
      float a[kW], b[kW];
      LoadVec(lo, a);
      LoadVec(lo + half, b);
      float ra[kW], rb[kW];
#pragma unroll
      for (int e = 0; e < kW; ++e) {
        ra[e] = a[e] * c[e] - b[e] * s[e];
        rb[e] = b[e] * c[e] + a[e] * s[e];
      }
      StoreVec(lo, ra);
      StoreVec(lo + half, rb);
    }
  }
}

}  // namespace

void Rope(uint16_t* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t pos0,
          const float* inv_freq, bool inverse, const int64_t* starts, int64_t num_docs,
          cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  if (tokens * heads * half == 0) return;
  const float sign = inverse ? -1.f : 1.f;
  if (half % 8 == 0 && Aligned16(x)) {
    RopeKernel<8><<<GridFor(tokens * half / 8, kThreads), kThreads, 0, stream>>>(
        x, tokens, heads, half, pos0, inv_freq, sign, starts, num_docs);
  } else {
    RopeKernel<1><<<GridFor(tokens * half, kThreads), kThreads, 0, stream>>>(
        x, tokens, heads, half, pos0, inv_freq, sign, starts, num_docs);
  }
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
