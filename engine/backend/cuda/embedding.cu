// Embedding lookup (gather) and its backward (scatter-add into the table's gradient).
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// One block per token; rows are copied as 16-bit words (d need not be a multiple of 8).
__global__ void EmbeddingForwardKernel(const int32_t* ids, const uint16_t* table, int64_t vocab,
                                       int64_t d, uint16_t* out) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  const bool ok = id >= 0 && id < vocab;
  const uint16_t* src = table + static_cast<int64_t>(ok ? id : 0) * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) out[t * d + i] = ok ? src[i] : 0;
}

// Repeated ids collide, hence atomics (the order of the f32 sums is not fixed).
template <typename T>
__global__ void EmbeddingBackwardKernel(const int32_t* ids, const uint16_t* dout, int64_t vocab,
                                        int64_t d, T* dtable);

template <>
__global__ void EmbeddingBackwardKernel<float>(const int32_t* ids, const uint16_t* dout,
                                               int64_t vocab, int64_t d, float* dtable) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0 || id >= vocab) return;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    atomicAdd(dtable + static_cast<int64_t>(id) * d + i, Bf(dout[t * d + i]));
}

template <>
__global__ void EmbeddingBackwardKernel<__nv_bfloat16>(const int32_t* ids, const uint16_t* dout,
                                                       int64_t vocab, int64_t d,
                                                       __nv_bfloat16* dtable) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0 || id >= vocab) return;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    atomicAdd(dtable + static_cast<int64_t>(id) * d + i, __ushort_as_bfloat16(dout[t * d + i]));
}

}  // namespace

void EmbeddingForward(const int32_t* ids, int64_t tokens, const uint16_t* table, int64_t vocab,
                      int64_t d, uint16_t* out, cudaStream_t stream) {
  if (tokens == 0 || d == 0) return;
  EmbeddingForwardKernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(ids, table, vocab,
                                                                                 d, out);
  cudaCheckLaunch();
}

void EmbeddingBackward(const int32_t* ids, int64_t tokens, const uint16_t* dout, int64_t vocab,
                       int64_t d, void* dtable, ElemType dt, cudaStream_t stream) {
  if (tokens == 0 || d == 0) return;
  const unsigned grid = static_cast<unsigned>(tokens);
  if (dt == ElemType::kF32) {
    EmbeddingBackwardKernel<float>
        <<<grid, kThreads, 0, stream>>>(ids, dout, vocab, d, static_cast<float*>(dtable));
  } else {
    EmbeddingBackwardKernel<__nv_bfloat16>
        <<<grid, kThreads, 0, stream>>>(ids, dout, vocab, d, static_cast<__nv_bfloat16*>(dtable));
  }
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
