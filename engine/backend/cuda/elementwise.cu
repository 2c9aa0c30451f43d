// Elementwise kernels and reductions: fill, dtype conversion, axpy, partial sums. Each is a
// grid-stride loop of 16-byte vector accesses where the pointers are 16-byte aligned, with a
// scalar tail (and a scalar loop where they are not).
#include <type_traits>

#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// Each thread stores 16-byte patterns of `value` where `vec` (x 16-byte aligned), then the tail
// one element at a time.
template <typename T>
__global__ void FillKernel(T* x, int64_t n, T value, bool vec) {
  constexpr int kPer = 16 / sizeof(T);  // elements per 16-byte store
  union {
    uint4 v;
    T e[kPer];
  } pattern;
#pragma unroll
  for (int k = 0; k < kPer; ++k) pattern.e[k] = value;
  const int64_t start = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t nv = vec ? n / kPer : 0;
  for (int64_t v = start; v < nv; v += stride) reinterpret_cast<uint4*>(x)[v] = pattern.v;
  for (int64_t i = nv * kPer + start; i < n; i += stride) x[i] = value;
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t n, bool vec) {
  GridStride8(n, vec, [&](auto w, int64_t i) {
    float f[decltype(w)::value];
    LoadVec(src + i, f);
    StoreVec(dst + i, f);
  });
}

template <typename X>
__global__ void AxpyKernel(float alpha, const X* x, float* y, int64_t n, bool vec) {
  GridStride8(n, vec, [&](auto w, int64_t i) {
    constexpr int kW = decltype(w)::value;
    float xf[kW], yf[kW];
    LoadVec(x + i, xf);
    LoadVec(y + i, yf);
#pragma unroll
    for (int e = 0; e < kW; ++e) yf[e] += alpha * xf[e];
    StoreVec(y + i, yf);
  });
}

// One grid-strided element of c per thread (the fallback path only: plain 2-byte accesses).
__global__ void AddBiasRowsKernel(uint16_t* c, int64_t ldc, int64_t rows, int64_t n,
                                  const uint16_t* bias) {
  const int64_t total = rows * n, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += stride) {
    const int64_t r = i / n, j = i % n;
    c[r * ldc + j] = ToBf(Bf(c[r * ldc + j]) + Bf(bias[j]));
  }
}

// Each block sums a grid-strided share in double and writes one partial. f32 and bf16 are read
// in 16-byte vectors where `vec`; i32 (exact in double, not in f32) one element at a time.
template <typename X>
__global__ void ReduceKernel(const X* x, int64_t n, bool squares, bool vec, double* partials) {
  double s = 0.0;
  if constexpr (std::is_same_v<X, int32_t>) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
      const double v = static_cast<double>(x[i]);
      s += squares ? v * v : v;
    }
  } else {
    GridStride8(n, vec, [&](auto w, int64_t i) {
      constexpr int kW = decltype(w)::value;
      float f[kW];
      LoadVec(x + i, f);
#pragma unroll
      for (int e = 0; e < kW; ++e) {
        const double v = static_cast<double>(f[e]);
        s += squares ? v * v : v;
      }
    });
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

// One warp: lane i sums partials i, i + 32, ... in double, then the warp adds them up.
__global__ void FinishReduceKernel(const double* partials, int blocks, float* out) {
  double s = 0.0;
  for (int i = threadIdx.x; i < blocks; i += 32) s += partials[i];
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (threadIdx.x == 0) out[0] = static_cast<float>(s);
}

// Grid for a loop over n elements, 8 per thread-step where `vec`.
unsigned GridFor8(int64_t n, bool vec, int64_t max_blocks = 132 * 16) {
  return GridFor(vec ? n / 8 : n, kThreads, max_blocks);
}

}  // namespace

void Fill(void* x, ElemType t, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = Aligned16(x);
  const unsigned grid = GridFor8(n, vec);  // 4 or 8 elements per 16 bytes: close enough
  switch (t) {
    case ElemType::kF32:
      FillKernel<<<grid, kThreads, 0, stream>>>(static_cast<float*>(x), n, value, vec);
      break;
    case ElemType::kBF16: {
      const uint16_t bits = __bfloat16_as_ushort(__float2bfloat16_rn(value));
      FillKernel<<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(x), n, bits, vec);
      break;
    }
    case ElemType::kI32:
      FillKernel<<<grid, kThreads, 0, stream>>>(static_cast<int32_t*>(x), n,
                                                static_cast<int32_t>(value), vec);
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
  const bool vec = Aligned16(src) && Aligned16(dst);
  const unsigned grid = GridFor8(n, vec);
  if (st == ElemType::kF32 && dt == ElemType::kBF16) {
    ConvertKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                 static_cast<uint16_t*>(dst), n, vec);
  } else if (st == ElemType::kBF16 && dt == ElemType::kF32) {
    ConvertKernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(src),
                                                 static_cast<float*>(dst), n, vec);
  } else {
    std::fprintf(stderr, "cuda::Convert: unsupported conversion %d -> %d\n", int(st), int(dt));
    std::abort();
  }
  cudaCheckLaunch();
}

void Axpy(float alpha, const void* x, ElemType xt, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = Aligned16(x) && Aligned16(y);
  const unsigned grid = GridFor8(n, vec);
  if (xt == ElemType::kBF16) {
    AxpyKernel<<<grid, kThreads, 0, stream>>>(alpha, static_cast<const uint16_t*>(x), y, n, vec);
  } else {
    AxpyKernel<<<grid, kThreads, 0, stream>>>(alpha, static_cast<const float*>(x), y, n, vec);
  }
  cudaCheckLaunch();
}

void AddBiasRows(uint16_t* c, int64_t ldc, int64_t rows, int64_t n, const uint16_t* bias,
                 cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  AddBiasRowsKernel<<<GridFor8(rows * n, false), kThreads, 0, stream>>>(c, ldc, rows, n, bias);
  cudaCheckLaunch();
}

int ReducePartials(const void* x, ElemType t, int64_t n, bool squares, double* partials,
                   cudaStream_t stream) {
  const bool vec = t != ElemType::kI32 && Aligned16(x);
  const unsigned grid = GridFor8(n, vec, kMaxReduceBlocks);
  switch (t) {
    case ElemType::kF32:
      ReduceKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(x), n, squares, vec,
                                                  partials);
      break;
    case ElemType::kBF16:
      ReduceKernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(x), n, squares, vec,
                                                  partials);
      break;
    case ElemType::kI32:
      ReduceKernel<<<grid, kThreads, 0, stream>>>(static_cast<const int32_t*>(x), n, squares, vec,
                                                  partials);
      break;
  }
  cudaCheckLaunch();
  return static_cast<int>(grid);
}

void FinishReduce(const double* partials, int blocks, float* out, cudaStream_t stream) {
  FinishReduceKernel<<<1, 32, 0, stream>>>(partials, blocks, out);
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
