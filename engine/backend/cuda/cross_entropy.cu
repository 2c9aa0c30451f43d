// Cross-entropy over one tile of logits, fused with its gradient (softmax − onehot).
#include <cmath>

#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 1024;

// One block per row. Pass 1: each thread keeps an online (max, Σexp) over its strided share;
// the block merges them. Pass 2 re-reads each element and writes its gradient, so dlogits may
// alias logits (every element is read by the thread that later writes it; the label's logit is
// read before the block barrier). Both passes move 8 elements per access where `vec` (vocab % 8
// == 0 and both pointers 16-byte aligned, so every row is), then a scalar tail.
template <typename T>
__global__ void CrossEntropyKernel(const T* logits, const int32_t* labels, int64_t vocab,
                                   float* losses, T* dlogits, float grad_scale, bool vec) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  T* dx = dlogits + row * vocab;
  const int32_t label = labels[row];
  if (label < 0 || label >= vocab) {
    // Ignored token (label >= vocab is a caller bug; treated as ignored rather than reading OOB).
    StrideLoop8(vocab, vec, threadIdx.x, blockDim.x, [&](auto w, int64_t j) {
      float z[decltype(w)::value] = {};
      StoreVec(dx + j, z);
    });
    if (threadIdx.x == 0) losses[row] = 0.f;
    return;
  }
  float m = -INFINITY, s = 0.f;
  StrideLoop8(vocab, vec, threadIdx.x, blockDim.x, [&](auto w, int64_t j) {
    constexpr int kW = decltype(w)::value;
    float v[kW];
    LoadVec(x + j, v);
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      if (v[e] > m) {
        s = s * expf(m - v[e]) + 1.f;
        m = v[e];
      } else {
        s += expf(v[e] - m);
      }
    }
  });
  __shared__ float target;
  if (threadIdx.x == 0) target = Load(x, label);
  const float block_max = BlockMax(m);
  const float total = BlockSum(m == -INFINITY ? 0.f : s * expf(m - block_max));
  const float lse = block_max + logf(total);
  if (threadIdx.x == 0) losses[row] = lse - target;
  StrideLoop8(vocab, vec, threadIdx.x, blockDim.x, [&](auto w, int64_t j) {
    constexpr int kW = decltype(w)::value;
    float v[kW];
    LoadVec(x + j, v);
#pragma unroll
    for (int e = 0; e < kW; ++e)
      v[e] = (expf(v[e] - lse) - (j + e == label ? 1.f : 0.f)) * grad_scale;
    StoreVec(dx + j, v);
  });
}

// One block per row: the block's largest logit, then the first column holding it (as a float:
// columns below 2^24 are exact), compared with the label.
template <typename T>
__global__ void LabelIsArgmaxKernel(const T* logits, const int32_t* labels, int64_t vocab,
                                    float* hits) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * vocab;
  const int32_t label = labels[row];
  if (label < 0 || label >= vocab) {
    if (threadIdx.x == 0) hits[row] = 0.f;
    return;
  }
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, Load(x, j));
  const float block_max = BlockMax(m);
  float first = -static_cast<float>(vocab);  // −(first column holding the max) of this thread
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    if (Load(x, j) == block_max) {
      first = -static_cast<float>(j);
      break;
    }
  }
  const float argmax = -BlockMax(first);
  if (threadIdx.x == 0) hits[row] = argmax == static_cast<float>(label) ? 1.f : 0.f;
}

}  // namespace

void LabelIsArgmax(const void* logits, ElemType lt, const int32_t* labels, int64_t tokens,
                   int64_t vocab, float* hits, cudaStream_t stream) {
  if (tokens == 0) return;
  const unsigned grid = static_cast<unsigned>(tokens);
  if (lt == ElemType::kBF16) {
    LabelIsArgmaxKernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(logits), labels,
                                                       vocab, hits);
  } else {
    LabelIsArgmaxKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(logits), labels,
                                                       vocab, hits);
  }
  cudaCheckLaunch();
}

void CrossEntropy(const void* logits, ElemType lt, const int32_t* labels, int64_t tokens,
                  int64_t vocab, float* losses, void* dlogits, float grad_scale,
                  cudaStream_t stream) {
  if (tokens == 0) return;
  const unsigned grid = static_cast<unsigned>(tokens);
  const bool vec = vocab % 8 == 0 && Aligned16(logits) && Aligned16(dlogits);
  if (lt == ElemType::kBF16) {
    CrossEntropyKernel<<<grid, kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(logits), labels, vocab, losses,
        static_cast<uint16_t*>(dlogits), grad_scale, vec);
  } else {
    CrossEntropyKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(logits), labels,
                                                      vocab, losses, static_cast<float*>(dlogits),
                                                      grad_scale, vec);
  }
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
