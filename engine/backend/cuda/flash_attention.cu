// The own causal GQA flash attention, forward and backward: a plain FFMA implementation
// (no tensor cores), the portable fallback to cuDNN and a second opinion in tests.
//
// Each query (or key) row is owned by kLanes consecutive threads that each hold D / kLanes of
// its elements in registers; dot products are finished with two shuffles. Blocks of kRows rows
// stream tiles of kRows keys (or queries) through shared memory; the softmax is online, so no
// S × S matrix exists. Backward: delta = rowsum(dO ⊙ O), then one kernel for dK, dV (summed
// over the query heads of a GQA group) and one for dQ.
//
// Documents (a packed sample): a query sees the keys from its document's start to itself. Key
// tiles wholly before the first row's document start are skipped, and query tiles wholly past
// the last key's document end, so a packed sample costs its documents' causal work plus the
// boundary tiles; the mask inside a tile is per element.
#include <cmath>

#include "engine/backend/cuda/bf16_util.cuh"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/documents.cuh"
#include "engine/backend/cuda/kernels.h"

namespace ithaca {
namespace cuda {
namespace {

constexpr int kLanes = 4;
constexpr int kRows = 64;
constexpr int kThreads = kRows * kLanes;

template <int E>
__device__ __forceinline__ float RowDot(const float (&a)[E], const uint16_t* b) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) s += a[e] * Bf(b[e]);
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return s;
}

template <int E>
__device__ __forceinline__ void LoadRow(const uint16_t* src, bool valid, float (&dst)[E]) {
#pragma unroll
  for (int e = 0; e < E; ++e) dst[e] = valid ? Bf(src[e]) : 0.f;
}

// Rows [r0, r0 + kRows) of head `head` of x [S, H, D] into tile [kRows][D] (zeros past S).
template <int D>
__device__ __forceinline__ void LoadTile(const uint16_t* x, int64_t s, int64_t heads, int64_t head,
                                         int64_t r0, uint16_t (*tile)[D]) {
  for (int idx = threadIdx.x; idx < kRows * D; idx += blockDim.x) {
    const int rr = idx / D, e = idx % D;
    const int64_t r = r0 + rr;
    tile[rr][e] = r < s ? x[(r * heads + head) * D + e] : 0;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t s, int64_t hq,
                  int64_t hkv, uint16_t* out, float* lse, const int64_t* starts, int64_t ndocs) {
  constexpr int E = D / kLanes;
  __shared__ uint16_t ks[kRows][D], vs[kRows][D];
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t i = blockIdx.x * int64_t(kRows) + r, h = blockIdx.y, g = h / (hq / hkv);
  const bool valid = i < s;
  const float scale = rsqrtf(static_cast<float>(D));
  float qr[E], acc[E];
  LoadRow<E>(q + (i * hq + h) * D + lane * E, valid, qr);
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  const int64_t last = min(s - 1, blockIdx.x * int64_t(kRows) + kRows - 1);
  const int64_t first = DocStart(starts, ndocs, blockIdx.x * int64_t(kRows));
  const int64_t doc = valid ? DocStart(starts, ndocs, i) : 0;
  for (int64_t j0 = first / kRows * kRows; j0 <= last; j0 += kRows) {
    __syncthreads();
    LoadTile<D>(k, s, hkv, g, j0, ks);
    LoadTile<D>(v, s, hkv, g, j0, vs);
    __syncthreads();
    const int nk = static_cast<int>(s - j0 < kRows ? s - j0 : kRows);
    for (int jj = 0; jj < nk; ++jj) {
      const float sc = RowDot<E>(qr, &ks[jj][lane * E]) * scale;
      if (valid && j0 + jj <= i && j0 + jj >= doc) {
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new), p = expf(sc - m_new);
        l = l * corr + p;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = acc[e] * corr + p * Bf(vs[jj][lane * E + e]);
        m = m_new;
      }
    }
  }
  if (!valid) return;
  uint16_t* o = out + (i * hq + h) * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = ToBf(acc[e] / l);
  if (lane == 0) lse[h * s + i] = m + logf(l);
}

// delta[h, i] = Σ_e dO[i, h, e] · O[i, h, e].
__global__ void DeltaKernel(const uint16_t* out, const uint16_t* dout, int64_t s, int64_t hq,
                            int64_t d, float* delta) {
  const int64_t n = s * hq;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const uint16_t* o = out + idx * d;
    const uint16_t* g = dout + idx * d;
    float acc = 0.f;
    for (int64_t e = 0; e < d; ++e) acc += Bf(o[e]) * Bf(g[e]);
    const int64_t i = idx / hq, h = idx % hq;
    delta[h * s + i] = acc;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    DkDvKernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
               const float* lse, const float* delta, int64_t s, int64_t hq, int64_t hkv,
               uint16_t* dk, uint16_t* dv, const int64_t* starts, int64_t ndocs) {
  constexpr int E = D / kLanes;
  __shared__ uint16_t qs[kRows][D], dos[kRows][D];
  __shared__ float lse_s[kRows], delta_s[kRows];
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t j = blockIdx.x * int64_t(kRows) + r, g = blockIdx.y, group = hq / hkv;
  const bool valid = j < s;
  const float scale = rsqrtf(static_cast<float>(D));
  float kr[E], vr[E], dkr[E], dvr[E];
  LoadRow<E>(k + (j * hkv + g) * D + lane * E, valid, kr);
  LoadRow<E>(v + (j * hkv + g) * D + lane * E, valid, vr);
#pragma unroll
  for (int e = 0; e < E; ++e) dkr[e] = dvr[e] = 0.f;
  // Queries past the document of the tile's last key see none of its keys.
  const int64_t end = DocEnd(starts, ndocs, s, min(s - 1, blockIdx.x * int64_t(kRows) + kRows - 1));
  const int64_t doc_end = valid ? DocEnd(starts, ndocs, s, j) : 0;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    // Queries before this key tile see none of its keys.
    for (int64_t i0 = blockIdx.x * int64_t(kRows); i0 < end; i0 += kRows) {
      __syncthreads();
      LoadTile<D>(q, s, hq, h, i0, qs);
      LoadTile<D>(dout, s, hq, h, i0, dos);
      if (threadIdx.x < kRows) {
        const int64_t i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < s ? lse[h * s + i] : 0.f;
        delta_s[threadIdx.x] = i < s ? delta[h * s + i] : 0.f;
      }
      __syncthreads();
      const int nq = static_cast<int>(s - i0 < kRows ? s - i0 : kRows);
      for (int ii = 0; ii < nq; ++ii) {
        const float sc = RowDot<E>(kr, &qs[ii][lane * E]) * scale;
        const float dp = RowDot<E>(vr, &dos[ii][lane * E]);
        if (valid && i0 + ii >= j && i0 + ii < doc_end) {
          const float p = expf(sc - lse_s[ii]);
          const float ds = p * (dp - delta_s[ii]) * scale;
#pragma unroll
          for (int e = 0; e < E; ++e) {
            dvr[e] += p * Bf(dos[ii][lane * E + e]);
            dkr[e] += ds * Bf(qs[ii][lane * E + e]);
          }
        }
      }
    }
  }
  if (!valid) return;
  uint16_t* dkp = dk + (j * hkv + g) * D + lane * E;
  uint16_t* dvp = dv + (j * hkv + g) * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    dkp[e] = ToBf(dkr[e]);
    dvp[e] = ToBf(dvr[e]);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    DqKernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
             const float* lse, const float* delta, int64_t s, int64_t hq, int64_t hkv, uint16_t* dq,
             const int64_t* starts, int64_t ndocs) {
  constexpr int E = D / kLanes;
  __shared__ uint16_t ks[kRows][D], vs[kRows][D];
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t i = blockIdx.x * int64_t(kRows) + r, h = blockIdx.y, g = h / (hq / hkv);
  const bool valid = i < s;
  const float scale = rsqrtf(static_cast<float>(D));
  float qr[E], dor[E], dqr[E];
  LoadRow<E>(q + (i * hq + h) * D + lane * E, valid, qr);
  LoadRow<E>(dout + (i * hq + h) * D + lane * E, valid, dor);
#pragma unroll
  for (int e = 0; e < E; ++e) dqr[e] = 0.f;
  const float lse_i = valid ? lse[h * s + i] : 0.f, delta_i = valid ? delta[h * s + i] : 0.f;
  const int64_t last = min(s - 1, blockIdx.x * int64_t(kRows) + kRows - 1);
  const int64_t first = DocStart(starts, ndocs, blockIdx.x * int64_t(kRows));
  const int64_t doc = valid ? DocStart(starts, ndocs, i) : 0;
  for (int64_t j0 = first / kRows * kRows; j0 <= last; j0 += kRows) {
    __syncthreads();
    LoadTile<D>(k, s, hkv, g, j0, ks);
    LoadTile<D>(v, s, hkv, g, j0, vs);
    __syncthreads();
    const int nk = static_cast<int>(s - j0 < kRows ? s - j0 : kRows);
    for (int jj = 0; jj < nk; ++jj) {
      const float sc = RowDot<E>(qr, &ks[jj][lane * E]) * scale;
      const float dp = RowDot<E>(dor, &vs[jj][lane * E]);
      if (valid && j0 + jj <= i && j0 + jj >= doc) {
        const float ds = expf(sc - lse_i) * (dp - delta_i) * scale;
#pragma unroll
        for (int e = 0; e < E; ++e) dqr[e] += ds * Bf(ks[jj][lane * E + e]);
      }
    }
  }
  if (!valid) return;
  uint16_t* p = dq + (i * hq + h) * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) p[e] = ToBf(dqr[e]);
}

template <int D>
void Forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t s, int64_t hq,
             int64_t hkv, uint16_t* out, float* lse, const int64_t* starts, int64_t ndocs,
             cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((s + kRows - 1) / kRows), static_cast<unsigned>(hq));
  ForwardKernel<D><<<grid, kThreads, 0, stream>>>(q, k, v, s, hq, hkv, out, lse, starts, ndocs);
  cudaCheckLaunch();
}

template <int D>
void Backward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
              const float* lse, const float* delta, int64_t s, int64_t hq, int64_t hkv,
              uint16_t* dq, uint16_t* dk, uint16_t* dv, const int64_t* starts, int64_t ndocs,
              cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((s + kRows - 1) / kRows);
  DkDvKernel<D><<<dim3(tiles, static_cast<unsigned>(hkv)), kThreads, 0, stream>>>(
      q, k, v, dout, lse, delta, s, hq, hkv, dk, dv, starts, ndocs);
  cudaCheckLaunch();
  DqKernel<D><<<dim3(tiles, static_cast<unsigned>(hq)), kThreads, 0, stream>>>(
      q, k, v, dout, lse, delta, s, hq, hkv, dq, starts, ndocs);
  cudaCheckLaunch();
}

}  // namespace

bool FlashAttentionSupports(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

void FlashAttentionForward(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t s,
                           int64_t hq, int64_t hkv, int64_t d, uint16_t* out, float* lse,
                           const int64_t* starts, int64_t ndocs, cudaStream_t stream) {
  if (s == 0) return;
  switch (d) {
    case 16:
      return Forward<16>(q, k, v, s, hq, hkv, out, lse, starts, ndocs, stream);
    case 32:
      return Forward<32>(q, k, v, s, hq, hkv, out, lse, starts, ndocs, stream);
    case 64:
      return Forward<64>(q, k, v, s, hq, hkv, out, lse, starts, ndocs, stream);
    case 128:
      return Forward<128>(q, k, v, s, hq, hkv, out, lse, starts, ndocs, stream);
  }
  std::fprintf(stderr, "FlashAttentionForward: head_dim %lld unsupported\n", (long long)d);
  std::abort();
}

void FlashAttentionBackward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                            const uint16_t* out, const uint16_t* dout, const float* lse, int64_t s,
                            int64_t hq, int64_t hkv, int64_t d, float* delta, uint16_t* dq,
                            uint16_t* dk, uint16_t* dv, const int64_t* starts, int64_t ndocs,
                            cudaStream_t stream) {
  if (s == 0) return;
  DeltaKernel<<<GridFor(s * hq, 256), 256, 0, stream>>>(out, dout, s, hq, d, delta);
  cudaCheckLaunch();
  switch (d) {
    case 16:
      return Backward<16>(q, k, v, dout, lse, delta, s, hq, hkv, dq, dk, dv, starts, ndocs, stream);
    case 32:
      return Backward<32>(q, k, v, dout, lse, delta, s, hq, hkv, dq, dk, dv, starts, ndocs, stream);
    case 64:
      return Backward<64>(q, k, v, dout, lse, delta, s, hq, hkv, dq, dk, dv, starts, ndocs, stream);
    case 128:
      return Backward<128>(q, k, v, dout, lse, delta, s, hq, hkv, dq, dk, dv, starts, ndocs,
                           stream);
  }
  std::fprintf(stderr, "FlashAttentionBackward: head_dim %lld unsupported\n", (long long)d);
  std::abort();
}

}  // namespace cuda
}  // namespace ithaca
