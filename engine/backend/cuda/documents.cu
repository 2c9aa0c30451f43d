// Packed samples' document metadata on the device: index arrays written from kernel parameters
// (no pinned staging buffer whose lifetime would have to outlast the copy, and no host wait),
// and the LSE transposition between cuDNN's ragged stats [S, H] and the engine's [H, S].
#include <algorithm>

#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

// Kernel parameters are limited to 4 KB (before CUDA 12.1): 480 values and the header fit.
constexpr int kChunk = 480;
struct Chunk {
  int64_t v[kChunk];
};

__global__ void WriteIndicesKernel(const Chunk chunk, int n, void* dst, bool as_int32) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (as_int32) {
    static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(chunk.v[i]);
  } else {
    static_cast<int64_t*>(dst)[i] = chunk.v[i];
  }
}

constexpr int kTile = 32;

// dst [cols, rows] = src [rows, cols]ᵀ through a padded shared tile (coalesced both ways).
__global__ void TransposeKernel(const float* src, int64_t rows, int64_t cols, float* dst) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t c0 = blockIdx.x * int64_t(kTile);
  // Row tiles stride by gridDim.y (at most 65535 blocks that way).
  for (int64_t r0 = blockIdx.y * int64_t(kTile); r0 < rows; r0 += gridDim.y * int64_t(kTile)) {
    __syncthreads();
    for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
      const int64_t r = r0 + y, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[y][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int y = threadIdx.y; y < kTile; y += blockDim.y) {
      const int64_t c = c0 + y, r = r0 + threadIdx.x;
      if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][y];
    }
  }
}

}  // namespace

void WriteIndices(const int64_t* values, int64_t n, void* dst, bool as_int32, cudaStream_t stream) {
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int m = static_cast<int>(n - i0 < kChunk ? n - i0 : kChunk);
    Chunk chunk;
    for (int i = 0; i < m; ++i) chunk.v[i] = values[i0 + i];
    void* at = as_int32 ? static_cast<void*>(static_cast<int32_t*>(dst) + i0)
                        : static_cast<void*>(static_cast<int64_t*>(dst) + i0);
    WriteIndicesKernel<<<(m + 127) / 128, 128, 0, stream>>>(chunk, m, at, as_int32);
    cudaCheckLaunch();
  }
}

void TransposeF32(const float* src, int64_t rows, int64_t cols, float* dst, cudaStream_t stream) {
  if (rows * cols == 0) return;
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                  static_cast<unsigned>(std::min<int64_t>((rows + kTile - 1) / kTile, 65535)));
  TransposeKernel<<<grid, dim3(kTile, 8), 0, stream>>>(src, rows, cols, dst);
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
