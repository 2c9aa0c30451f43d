// Device helpers shared by the kernel files: bf16 <-> f32 loads/stores (scalar and 16-byte
// vectors), grid-stride loops over vectors, and warp / block reductions.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

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

// ---- 16-byte vector accesses. Bandwidth-bound kernels move 8 elements per access: one uint4 of
// bf16 or two float4 of f32. The caller checks the alignment (Aligned16) and keeps a scalar path
// for the rest; a vector of 8 elements starts at a multiple of 8 from a 16-byte-aligned base.

// True where p may be accessed with 16-byte vectors.
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// 8 bf16 (one uint4, element 0 in the low half of .x) <-> 8 floats.
__device__ __forceinline__ void UnpackBf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    f[2 * k] = __uint_as_float(u[k] << 16);
    f[2 * k + 1] = __uint_as_float(u[k] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint4 PackBf16x8(const float (&f)[8]) {
  uint32_t u[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    u[k] =
        static_cast<uint32_t>(ToBf(f[2 * k])) | (static_cast<uint32_t>(ToBf(f[2 * k + 1])) << 16);
  }
  return make_uint4(u[0], u[1], u[2], u[3]);
}

// kW consecutive elements from p (f32 or bf16 bits) as floats, and back (bf16 rounds to nearest
// even, as Store). kW is 8 (p 16-byte aligned) or 1.
template <int kW, typename T>
__device__ __forceinline__ void LoadVec(const T* p, float (&f)[kW]) {
  static_assert(kW == 1 || kW == 8, "vectors are 1 or 8 elements");
  if constexpr (kW == 1) {
    f[0] = Load(p, 0);
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    UnpackBf16x8(*reinterpret_cast<const uint4*>(p), f);
  } else {
    static_assert(std::is_same_v<T, float>, "f32 or bf16");
    const float4 a = reinterpret_cast<const float4*>(p)[0],
                 b = reinterpret_cast<const float4*>(p)[1];
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
    f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  }
}
template <int kW, typename T>
__device__ __forceinline__ void StoreVec(T* p, const float (&f)[kW]) {
  static_assert(kW == 1 || kW == 8, "vectors are 1 or 8 elements");
  if constexpr (kW == 1) {
    Store(p, 0, f[0]);
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    *reinterpret_cast<uint4*>(p) = PackBf16x8(f);
  } else {
    static_assert(std::is_same_v<T, float>, "f32 or bf16");
    reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

// A vector width as a type, for the generic lambdas of StrideLoop8: decltype(w)::value.
template <int kW>
using Width = std::integral_constant<int, kW>;

// Visits [0, n) from `start` in steps of `stride` (threads), 8 elements at a time where `vec`
// (the caller checked Aligned16 on every pointer), then the remaining elements one at a time:
// f(Width<8>{}, i) handles [i, i + 8), f(Width<1>{}, i) handles i.
template <typename F>
__device__ __forceinline__ void StrideLoop8(int64_t n, bool vec, int64_t start, int64_t stride,
                                            F&& f) {
  const int64_t nv = vec ? n / 8 : 0;
  for (int64_t v = start; v < nv; v += stride) f(Width<8>{}, v * 8);
  for (int64_t i = nv * 8 + start; i < n; i += stride) f(Width<1>{}, i);
}

// StrideLoop8 over the whole grid.
template <typename F>
__device__ __forceinline__ void GridStride8(int64_t n, bool vec, F&& f) {
  StrideLoop8(n, vec, blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
              int64_t(gridDim.x) * blockDim.x, f);
}

// ---- Reductions.

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

// Blocks for a grid-stride loop over n items: one item per thread, at most max_blocks.
inline unsigned GridFor(int64_t n, int threads, int64_t max_blocks = 132 * 16) {
  int64_t b = (n + threads - 1) / threads;
  if (b > max_blocks) b = max_blocks;
  if (b < 1) b = 1;
  return static_cast<unsigned>(b);
}

}  // namespace cuda
}  // namespace ithaca
