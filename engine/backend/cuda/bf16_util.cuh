// Device helpers shared by the kernel files: bf16 <-> f32 loads/stores and warp reductions.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace ithaca {
namespace cuda {

__device__ __forceinline__ float Bf(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t ToBf(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// Loads / stores of f32 or bf16 elements through one template.
template <typename T>
__device__ __forceinline__ float Load(const T* p, int64_t i);
template <>
__device__ __forceinline__ float Load<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float Load<uint16_t>(const uint16_t* p, int64_t i) {
  return Bf(p[i]);
}
template <typename T>
__device__ __forceinline__ void Store(T* p, int64_t i, float v);
template <>
__device__ __forceinline__ void Store<float>(float* p, int64_t i, float v) {
  p[i] = v;
}
template <>
__device__ __forceinline__ void Store<uint16_t>(uint16_t* p, int64_t i, float v) {
  p[i] = ToBf(v);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.f;
    s = WarpSum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

// Max over the block, like BlockSum.
__device__ __forceinline__ float BlockMax(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  v = WarpMax(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : -INFINITY;
    s = WarpMax(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

inline unsigned GridFor(int64_t n, int threads, int64_t max_blocks = 132 * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b > max_blocks) b = max_blocks;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b);
}

}  // namespace cuda
}  // namespace ithaca
