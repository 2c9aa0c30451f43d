// RMSNorm kernels and their launchers.
//
// Two paths. The vector path (d % 8 == 0 and every pointer 16-byte aligned: the engine's shapes)
// gives each row to a team of one or more warps; each thread holds up to kVecs 16-byte vectors
// (8 bf16 each) of the row in registers from the sum-of-squares pass to the write pass, so every
// byte is read from memory once. Blocks have at least 256 threads, i.e. several rows for small
// teams. The scalar path (odd d, unaligned views) is one block per row with 2-byte accesses.
#include <cuda_bf16.h>

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/rmsnorm.h"

namespace ithaca {
namespace cuda {
namespace {

// ---- Vector path.

// A team of kWarps warps per row, each thread holding up to kVecs vectors of it; blocks of at
// least 256 threads hold kRows teams. Thread t of a team owns the row's vectors t, t + kThreads,
// ..., so one warp-wide access covers 512 contiguous bytes.
template <int kVecs, int kWarps>
struct Team {
  static constexpr int kVecsPerThread = kVecs;
  static constexpr int kWarpsPerTeam = kWarps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlock = kThreads < 256 ? 256 : kThreads;
  static constexpr int kRows = kBlock / kThreads;
  static constexpr int64_t kMaxD = int64_t(kThreads) * kVecs * 8;
};

// Calls f(Team<kVecs, kWarps>{}) for the smallest team that holds a row of d elements in
// registers: first more vectors per thread (up to kMaxVecs) in one warp, then more warps (up to
// 16). Returns false where no team does (d too large).
template <int kMaxVecs, int kVecs = 1, int kWarps = 1, typename F>
bool ForTeam(int64_t d, F&& f) {
  if (d <= Team<kVecs, kWarps>::kMaxD) {
    f(Team<kVecs, kWarps>{});
    return true;
  }
  if constexpr (kVecs < kMaxVecs) {
    return ForTeam<kMaxVecs, kVecs * 2, kWarps>(d, f);
  } else if constexpr (kWarps < 16) {
    return ForTeam<kMaxVecs, kVecs, kWarps * 2>(d, f);
  } else {
    return false;
  }
}

// Sum over a team of kWarps consecutive warps; every thread of the team gets the result. `slots`:
// kWarps floats of shared memory owned by the team. With kWarps > 1 it holds barriers over the
// team's threads (named barrier 1 + team; 0 is __syncthreads's), so the block's other teams do
// not wait; every thread of the team must call it.
template <int kWarps>
__device__ __forceinline__ float TeamSum(float v, int team, float* slots) {
  v = WarpSum(v);
  if constexpr (kWarps == 1) {
    return v;
  } else {
    auto team_barrier = [team] {
      asm volatile("bar.sync %0, %1;" ::"r"(team + 1), "n"(32 * kWarps) : "memory");
    };
    team_barrier();  // slots may still be read by the previous call
    if (threadIdx.x % 32 == 0) slots[(threadIdx.x / 32) % kWarps] = v;
    team_barrier();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) s += slots[i];
    return s;
  }
}

// Forward: one row per team. Reads x once (kept in registers), w from cache.
template <int kVecs, int kWarps>
__global__ void __launch_bounds__(Team<kVecs, kWarps>::kBlock)
    RmsNormForwardVecKernel(const uint16_t* x, const uint16_t* w, float eps, int64_t rows,
                            int64_t d, uint16_t* out, float* rstd) {
  using T = Team<kVecs, kWarps>;
  __shared__ float slots[T::kRows * kWarps];
  const int team = threadIdx.x / T::kThreads, t = threadIdx.x % T::kThreads;
  const int64_t row = blockIdx.x * int64_t(T::kRows) + team, nvec = d / 8;
  const bool live = row < rows;  // a dead team still joins its TeamSum's barriers
  const uint4* xr = reinterpret_cast<const uint4*>(x) + row * nvec;
  uint4 xv[kVecs] = {};
  float sq = 0.f;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t j = k * T::kThreads + t;
    if (live && j < nvec) {
      xv[k] = xr[j];
      float f[8];
      UnpackBf16x8(xv[k], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) sq += f[e] * f[e];
    }
  }
  sq = TeamSum<kWarps>(sq, team, slots + team * kWarps);
  if (!live) return;
  const float rs = rsqrtf(sq / static_cast<float>(d) + eps);
  if (t == 0) rstd[row] = rs;
  uint4* outr = reinterpret_cast<uint4*>(out) + row * nvec;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t j = k * T::kThreads + t;
    if (j < nvec) {
      float xf[8], wf[8], o[8];
      UnpackBf16x8(xv[k], xf);
      LoadVec(w + 8 * j, wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = xf[e] * rs * wf[e];
      outr[j] = PackBf16x8(o);
    }
  }
}

// Backward: each team strides over the rows (the grid is one wave of resident blocks). A
// thread's columns are the same in every row, so w and its dw partials stay in registers; at the
// end the block's teams add their partials in shared memory and the block does one atomicAdd
// per column. About 125 registers a thread: two blocks of 256 (or one of 512) per SM.
// kInPlace (RmsNormBackwardInPlace): rstd is remade from the row of x already in registers
// (`rstd` unused, `eps` used) and dx is written rather than accumulated; dx may be dout.
template <int kVecs, int kWarps, bool kInPlace>
__global__ void __launch_bounds__(Team<kVecs, kWarps>::kBlock, 512 / Team<kVecs, kWarps>::kBlock)
    RmsNormBackwardVecKernel(const uint16_t* x, const uint16_t* w, const float* rstd, float eps,
                             const uint16_t* dout, int64_t rows, int64_t d, uint16_t* dx,
                             float* dw) {
  using T = Team<kVecs, kWarps>;
  __shared__ float slots[T::kRows * kWarps];
  const int team = threadIdx.x / T::kThreads, t = threadIdx.x % T::kThreads;
  const int64_t nvec = d / 8;
  uint4 wv[kVecs] = {};
  float dw_part[kVecs][8] = {};
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    const int64_t j = k * T::kThreads + t;
    if (j < nvec) wv[k] = reinterpret_cast<const uint4*>(w)[j];
  }
  // The trip count is the same for the whole team (TeamSum's barriers).
  for (int64_t base = blockIdx.x * int64_t(T::kRows); base < rows;
       base += int64_t(gridDim.x) * T::kRows) {
    const int64_t row = base + team;
    const bool live = row < rows;
    // Early: its latency overlaps the row's loads.
    float rs = !kInPlace && live ? rstd[row] : 0.f;
    const uint4* xr = reinterpret_cast<const uint4*>(x) + row * nvec;
    const uint4* gr = reinterpret_cast<const uint4*>(dout) + row * nvec;
    uint4 xv[kVecs] = {}, gv[kVecs] = {};
    float dot = 0.f;  // Σ dout ⊙ w ⊙ x over the row
    float sq = 0.f;   // Σ x² (kInPlace)
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = k * T::kThreads + t;
      if (live && j < nvec) {
        xv[k] = xr[j];
        gv[k] = gr[j];
        float xf[8], gf[8], wf[8];
        UnpackBf16x8(xv[k], xf);
        UnpackBf16x8(gv[k], gf);
        UnpackBf16x8(wv[k], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          dot += gf[e] * wf[e] * xf[e];
          if constexpr (kInPlace) sq += xf[e] * xf[e];
        }
      }
    }
    dot = TeamSum<kWarps>(dot, team, slots + team * kWarps);
    if constexpr (kInPlace) {
      sq = TeamSum<kWarps>(sq, team, slots + team * kWarps);
      rs = rsqrtf(sq / static_cast<float>(d) + eps);  // as the forward computed it
    }
    if (!live) continue;
    const float c = dot / static_cast<float>(d) * rs * rs;
    uint4* dxr = reinterpret_cast<uint4*>(dx) + row * nvec;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = k * T::kThreads + t;
      if (j < nvec) {
        float xf[8], gf[8], wf[8], df[8];
        UnpackBf16x8(xv[k], xf);
        UnpackBf16x8(gv[k], gf);
        UnpackBf16x8(wv[k], wf);
        if constexpr (!kInPlace) UnpackBf16x8(dxr[j], df);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float g = rs * (gf[e] * wf[e] - xf[e] * c);
          df[e] = kInPlace ? g : df[e] + g;
          dw_part[k][e] += gf[e] * xf[e] * rs;
        }
        dxr[j] = PackBf16x8(df);
      }
    }
  }
  if constexpr (T::kRows == 1) {
    // The team is the block: each column has one owner thread.
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = k * T::kThreads + t;
      if (j < nvec) {
#pragma unroll
        for (int e = 0; e < 8; ++e) atomicAdd(dw + 8 * j + e, dw_part[k][e]);
      }
    }
  } else {
    __shared__ float block_dw[T::kMaxD];
    for (int64_t i = threadIdx.x; i < d; i += T::kBlock) block_dw[i] = 0.f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t j = k * T::kThreads + t;
      if (j < nvec) {
#pragma unroll
        for (int e = 0; e < 8; ++e) atomicAdd(&block_dw[8 * j + e], dw_part[k][e]);
      }
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < d; i += T::kBlock) atomicAdd(dw + i, block_dw[i]);
  }
}

// ---- Scalar path (any d, any alignment).

constexpr int kScalarThreads = 256;

// One block per row: a strided sum of squares, a block reduction, then the scaled write (which
// re-reads x, mostly from cache).
__global__ void RmsNormForwardScalarKernel(const uint16_t* x, const uint16_t* w, float eps,
                                           int64_t d, uint16_t* out, float* rstd) {
  const int64_t row = blockIdx.x;
  const uint16_t* xr = x + row * d;
  float sq = 0.f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = Bf(xr[i]);
    sq += v * v;
  }
  sq = BlockSum(sq);
  const float rs = rsqrtf(sq / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) rstd[row] = rs;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    out[row * d + i] = ToBf(Bf(xr[i]) * rs * Bf(w[i]));
}

// One block per row, the blocks striding over the rows; dw partials of all the block's rows in
// shared memory (column i is only ever touched by thread i % blockDim), then one atomic per
// column.
// in_place as the vector kernel's kInPlace: rstd remade (with eps), dx written (it may be dout;
// thread i reads column i of dout before it writes that column of dx, and no other thread reads
// it after the reduction's barrier).
__global__ void RmsNormBackwardScalarKernel(const uint16_t* x, const uint16_t* w, const float* rstd,
                                            float eps, bool in_place, const uint16_t* dout,
                                            int64_t rows, int64_t d, uint16_t* dx, float* dw) {
  extern __shared__ float dw_partial[];
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dw_partial[i] = 0.f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint16_t* xr = x + r * d;
    const uint16_t* gr = dout + r * d;
    float dot = 0.f, sq = 0.f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float xv = Bf(xr[i]);
      dot += Bf(gr[i]) * Bf(w[i]) * xv;
      sq += xv * xv;
    }
    dot = BlockSum(dot);
    const float rs = in_place ? rsqrtf(BlockSum(sq) / static_cast<float>(d) + eps) : rstd[r];
    const float c = dot / static_cast<float>(d) * rs * rs;
    uint16_t* dxr = dx + r * d;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float xv = Bf(xr[i]), g = Bf(gr[i]);
      const float gx = rs * (g * Bf(w[i]) - xv * c);
      dxr[i] = ToBf(in_place ? gx : Bf(dxr[i]) + gx);
      dw_partial[i] += g * xv * rs;
    }
  }
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) atomicAdd(dw + i, dw_partial[i]);
}

// ---- Launch helpers.

// The vector path needs whole 8-element vectors per row and 16-byte-aligned rows.
bool Vectorizable(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % 8 != 0) return false;
  for (const void* p : ptrs) {
    if (!Aligned16(p)) return false;
  }
  return true;
}

// Blocks of `kernel` resident on one SM at once.
template <typename K>
int BlocksPerSm(K kernel, int threads, size_t smem) {
  int per_sm = 0;
  cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return std::max(1, per_sm);
}

// The backward's grid: one wave of resident blocks (fewer for few rows), each striding over the
// rows, so the dw atomics (d per block) stay negligible next to the rows' traffic however large
// S is.
unsigned BackwardGrid(int64_t rows, int64_t rows_per_step, int blocks_per_sm) {
  int dev = 0, sms = 0;
  cudaCheck(cudaGetDevice(&dev));
  cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int64_t wave = int64_t(sms) * blocks_per_sm;
  return static_cast<unsigned>(std::min((rows + rows_per_step - 1) / rows_per_step, wave));
}

}  // namespace

void RmsNormForward(const uint16_t* x, const uint16_t* w, float eps, int64_t rows, int64_t d,
                    uint16_t* out, float* rstd, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  // The vector path where it applies (ForTeam returns false for d beyond its largest team).
  bool launched = false;
  if (Vectorizable(d, {x, w, out})) {
    launched = ForTeam<8>(d, [&](auto team) {
      using T = decltype(team);
      const unsigned grid = static_cast<unsigned>((rows + T::kRows - 1) / T::kRows);
      RmsNormForwardVecKernel<T::kVecsPerThread, T::kWarpsPerTeam>
          <<<grid, T::kBlock, 0, stream>>>(x, w, eps, rows, d, out, rstd);
    });
  }
  if (!launched) {
    RmsNormForwardScalarKernel<<<static_cast<unsigned>(rows), kScalarThreads, 0, stream>>>(
        x, w, eps, d, out, rstd);
  }
  cudaCheckLaunch();
}

namespace {

// Both backwards: RmsNormBackward (in_place false: rstd given, dx accumulated) and
// RmsNormBackwardInPlace (rstd remade with eps, dx written, dx == dout allowed).
void LaunchBackward(const uint16_t* x, const uint16_t* w, const float* rstd, float eps,
                    bool in_place, const uint16_t* dout, int64_t rows, int64_t d, uint16_t* dx,
                    float* dw, cudaStream_t stream) {
  if (rows == 0 || d == 0) return;
  // At most four vectors per thread: x, dout, w and 32 f32 dw partials stay in registers.
  bool launched = false;
  if (Vectorizable(d, {x, w, dout, dx})) {
    launched = ForTeam<4>(d, [&](auto team) {
      using T = decltype(team);
      // One instantiation (and so one cached occupancy) per kernel: team and kInPlace.
      auto launch = [&](auto in_place_constant) {
        constexpr bool kInPlace = decltype(in_place_constant)::value;
        auto* kernel = RmsNormBackwardVecKernel<T::kVecsPerThread, T::kWarpsPerTeam, kInPlace>;
        static const int per_sm = BlocksPerSm(kernel, T::kBlock, 0);  // once per kernel
        const unsigned grid = BackwardGrid(rows, T::kRows, per_sm);
        kernel<<<grid, T::kBlock, 0, stream>>>(x, w, rstd, eps, dout, rows, d, dx, dw);
      };
      if (in_place) {
        launch(std::true_type{});
      } else {
        launch(std::false_type{});
      }
    });
  }
  if (!launched) {
    const size_t smem = static_cast<size_t>(d) * sizeof(float);
    if (smem > 48 * 1024) {
      std::fprintf(stderr,
                   "RmsNormBackward: d = %lld exceeds the 12288 the scalar kernel supports (the "
                   "vector path, d %% 8 == 0 and aligned rows, takes up to 16384)\n",
                   static_cast<long long>(d));
      std::abort();
    }
    const unsigned grid =
        BackwardGrid(rows, 1, BlocksPerSm(RmsNormBackwardScalarKernel, kScalarThreads, smem));
    RmsNormBackwardScalarKernel<<<grid, kScalarThreads, smem, stream>>>(x, w, rstd, eps, in_place,
                                                                        dout, rows, d, dx, dw);
  }
  cudaCheckLaunch();
}

}  // namespace

void RmsNormBackward(const uint16_t* x, const uint16_t* w, const float* rstd, const uint16_t* dout,
                     int64_t rows, int64_t d, uint16_t* dx, float* dw, cudaStream_t stream) {
  LaunchBackward(x, w, rstd, 0.f, /*in_place=*/false, dout, rows, d, dx, dw, stream);
}

void RmsNormBackwardInPlace(const uint16_t* x, const uint16_t* w, float eps, uint16_t* grad,
                            int64_t rows, int64_t d, float* dw, cudaStream_t stream) {
  LaunchBackward(x, w, nullptr, eps, /*in_place=*/true, grad, rows, d, grad, dw, stream);
}

}  // namespace cuda
}  // namespace ithaca
