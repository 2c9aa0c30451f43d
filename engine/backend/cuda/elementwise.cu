// Elementwise kernels and reductions: fill, dtype conversion, axpy, partial sums.
#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void FillKernel(T* x, int64_t n, T value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = value;
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    Store(dst, i, Load(src, i));
}

template <typename X>
__global__ void AxpyKernel(float alpha, const X* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] += alpha * Load(x, i);
}

template <typename X>
__device__ __forceinline__ double LoadD(const X* x, int64_t i) {
  return static_cast<double>(Load(x, i));
}
template <>
__device__ __forceinline__ double LoadD<int32_t>(const int32_t* x, int64_t i) {
  return static_cast<double>(x[i]);
}

// Each block sums a grid-strided share in double and writes one partial.
template <typename X>
__global__ void ReduceKernel(const X* x, int64_t n, bool squares, double* partials) {
  double s = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double v = LoadD(x, i);
    s += squares ? v * v : v;
  }
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  __shared__ double warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) t += warp_sums[w];
    partials[blockIdx.x] = t;
  }
}

}  // namespace

void Fill(void* x, ElemType t, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = GridFor(n, kThreads);
  switch (t) {
    case ElemType::kF32:
      FillKernel<<<grid, kThreads, 0, stream>>>(static_cast<float*>(x), n, value);
      break;
    case ElemType::kBF16: {
      const uint16_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(value));
      FillKernel<<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(x), n, bits);
      break;
    }
    case ElemType::kI32:
      FillKernel<<<grid, kThreads, 0, stream>>>(static_cast<int32_t*>(x), n,
                                                static_cast<int32_t>(value));
      break;
  }
  cudaCheckLaunch();
}

void Convert(const void* src, ElemType st, void* dst, ElemType dt, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  if (st == dt) {
    const size_t bytes = static_cast<size_t>(n) * (st == ElemType::kBF16 ? 2 : 4);
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    return;
  }
  const unsigned grid = GridFor(n, kThreads);
  if (st == ElemType::kF32 && dt == ElemType::kBF16) {
    ConvertKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                 static_cast<uint16_t*>(dst), n);
  } else if (st == ElemType::kBF16 && dt == ElemType::kF32) {
    ConvertKernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(src),
                                                 static_cast<float*>(dst), n);
  } else {
    std::fprintf(stderr, "cuda::Convert: unsupported conversion %d -> %d\n", int(st), int(dt));
    std::abort();
  }
  cudaCheckLaunch();
}

void Axpy(float alpha, const void* x, ElemType xt, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = GridFor(n, kThreads);
  if (xt == ElemType::kBF16) {
    AxpyKernel<<<grid, kThreads, 0, stream>>>(alpha, static_cast<const uint16_t*>(x), y, n);
  } else {
    AxpyKernel<<<grid, kThreads, 0, stream>>>(alpha, static_cast<const float*>(x), y, n);
  }
  cudaCheckLaunch();
}

int ReducePartials(const void* x, ElemType t, int64_t n, bool squares, double* partials,
                   cudaStream_t stream) {
  const unsigned grid = GridFor(n, kThreads, kMaxReduceBlocks);
  switch (t) {
    case ElemType::kF32:
      ReduceKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x), n, squares,
                                                  partials);
      break;
    case ElemType::kBF16:
      ReduceKernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(x), n, squares,
                                                  partials);
      break;
    case ElemType::kI32:
      ReduceKernel<<<grid, kThreads, 0, stream>>>(static_cast<const int32_t*>(x), n, squares,
                                                  partials);
      break;
  }
  cudaCheckLaunch();
  return static_cast<int>(grid);
}

}  // namespace cuda
}  // namespace ithaca
