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

// Where the queries and keys of a call sit in the sample (FlashSpan, kernels.h), and the mask
// over sample positions: key position kp is visible to query position qp when it is at or before
// it, in its document and in its window.
struct Mask {
  FlashSpan sp;
  const int64_t* starts;
  int64_t ndocs;
  __host__ __device__ int64_t extent() const { return max(sp.q_pos0 + sp.sq, sp.k_pos0 + sp.sk); }
  // The first key position query position qp sees.
  __device__ __forceinline__ int64_t First(int64_t qp) const {
    const int64_t doc = DocStart(starts, ndocs, qp);
    return sp.window > 0 ? max(doc, qp - sp.window + 1) : doc;
  }
  // One past the last query position that sees key position kp.
  __device__ __forceinline__ int64_t End(int64_t kp) const {
    const int64_t doc = DocEnd(starts, ndocs, extent(), kp);
    return sp.window > 0 ? min(doc, kp + sp.window) : doc;
  }
};

template <int D>
__global__ void __launch_bounds__(kThreads)
    ForwardKernel(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t hq, int64_t hkv,
                  uint16_t* out, float* lse, Mask mask) {
  constexpr int E = D / kLanes;
  __shared__ uint16_t ks[kRows][D], vs[kRows][D];
  const FlashSpan& sp = mask.sp;
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t i0 = blockIdx.x * int64_t(kRows), i = i0 + r, h = blockIdx.y, g = h / (hq / hkv);
  const bool valid = i < sp.sq;
  const int64_t pos = sp.q_pos0 + i;
  const float scale = rsqrtf(static_cast<float>(D));
  float qr[E], acc[E];
  LoadRow<E>(q + (i * hq + h) * D + lane * E, valid, qr);
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = 0.f;
  float m = -INFINITY, l = 0.f;
  // Local key rows: from the tile of the block's first visible key to the block's last query.
  const int64_t j_end = min(sp.sk, sp.q_pos0 + min(sp.sq, i0 + kRows) - sp.k_pos0);
  const int64_t j_begin = max(int64_t(0), mask.First(sp.q_pos0 + i0) - sp.k_pos0) / kRows * kRows;
  const int64_t first = valid ? mask.First(pos) : 0;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kRows) {
    __syncthreads();
    LoadTile<D>(k, sp.sk, hkv, g, j0, ks);
    LoadTile<D>(v, sp.sk, hkv, g, j0, vs);
    __syncthreads();
    const int nk = static_cast<int>(sp.sk - j0 < kRows ? sp.sk - j0 : kRows);
    for (int jj = 0; jj < nk; ++jj) {
      const float sc = RowDot<E>(qr, &ks[jj][lane * E]) * scale;
      const int64_t kp = sp.k_pos0 + j0 + jj;
      if (valid && kp <= pos && kp >= first) {
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
  const float inv = l > 0.f ? 1.f / l : 0.f;  // a row that sees no key of the chunk: 0, −inf
#pragma unroll
  for (int e = 0; e < E; ++e) o[e] = ToBf(acc[e] * inv);
  if (lane == 0) lse[h * sp.sq + i] = l > 0.f ? m + logf(l) : -INFINITY;
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
               const float* lse, const float* delta, int64_t hq, int64_t hkv, uint16_t* dk,
               uint16_t* dv, Mask mask) {
  constexpr int E = D / kLanes;
  __shared__ uint16_t qs[kRows][D], dos[kRows][D];
  __shared__ float lse_s[kRows], delta_s[kRows];
  const FlashSpan& sp = mask.sp;
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t j0 = blockIdx.x * int64_t(kRows), j = j0 + r, g = blockIdx.y, group = hq / hkv;
  const bool valid = j < sp.sk;
  const int64_t kp = sp.k_pos0 + j;
  const float scale = rsqrtf(static_cast<float>(D));
  float kr[E], vr[E], dkr[E], dvr[E];
  LoadRow<E>(k + (j * hkv + g) * D + lane * E, valid, kr);
  LoadRow<E>(v + (j * hkv + g) * D + lane * E, valid, vr);
#pragma unroll
  for (int e = 0; e < E; ++e) dkr[e] = dvr[e] = 0.f;
  // Local query rows: from the tile's first key to past the document (or window) of its last.
  const int64_t last_kp = sp.k_pos0 + min(sp.sk, j0 + kRows) - 1;
  const int64_t i_begin = max(int64_t(0), sp.k_pos0 + j0 - sp.q_pos0);
  const int64_t i_end = min(sp.sq, mask.End(last_kp) - sp.q_pos0);
  const int64_t end = valid ? mask.End(kp) : 0;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t i0 = i_begin; i0 < i_end; i0 += kRows) {
      __syncthreads();
      LoadTile<D>(q, sp.sq, hq, h, i0, qs);
      LoadTile<D>(dout, sp.sq, hq, h, i0, dos);
      if (threadIdx.x < kRows) {
        const int64_t i = i0 + threadIdx.x;
        lse_s[threadIdx.x] = i < sp.sq ? lse[h * sp.sq + i] : 0.f;
        delta_s[threadIdx.x] = i < sp.sq ? delta[h * sp.sq + i] : 0.f;
      }
      __syncthreads();
      const int nq = static_cast<int>(sp.sq - i0 < kRows ? sp.sq - i0 : kRows);
      for (int ii = 0; ii < nq; ++ii) {
        const float sc = RowDot<E>(kr, &qs[ii][lane * E]) * scale;
        const float dp = RowDot<E>(vr, &dos[ii][lane * E]);
        const int64_t qp = sp.q_pos0 + i0 + ii;
        if (valid && qp >= kp && qp < end) {
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
             const float* lse, const float* delta, int64_t hq, int64_t hkv, uint16_t* dq,
             Mask mask) {
  constexpr int E = D / kLanes;
  __shared__ uint16_t ks[kRows][D], vs[kRows][D];
  const FlashSpan& sp = mask.sp;
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int64_t i0 = blockIdx.x * int64_t(kRows), i = i0 + r, h = blockIdx.y, g = h / (hq / hkv);
  const bool valid = i < sp.sq;
  const int64_t pos = sp.q_pos0 + i;
  const float scale = rsqrtf(static_cast<float>(D));
  float qr[E], dor[E], dqr[E];
  LoadRow<E>(q + (i * hq + h) * D + lane * E, valid, qr);
  LoadRow<E>(dout + (i * hq + h) * D + lane * E, valid, dor);
#pragma unroll
  for (int e = 0; e < E; ++e) dqr[e] = 0.f;
  const float lse_i = valid ? lse[h * sp.sq + i] : 0.f;
  const float delta_i = valid ? delta[h * sp.sq + i] : 0.f;
  const int64_t j_end = min(sp.sk, sp.q_pos0 + min(sp.sq, i0 + kRows) - sp.k_pos0);
  const int64_t j_begin = max(int64_t(0), mask.First(sp.q_pos0 + i0) - sp.k_pos0) / kRows * kRows;
  const int64_t first = valid ? mask.First(pos) : 0;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kRows) {
    __syncthreads();
    LoadTile<D>(k, sp.sk, hkv, g, j0, ks);
    LoadTile<D>(v, sp.sk, hkv, g, j0, vs);
    __syncthreads();
    const int nk = static_cast<int>(sp.sk - j0 < kRows ? sp.sk - j0 : kRows);
    for (int jj = 0; jj < nk; ++jj) {
      const float sc = RowDot<E>(qr, &ks[jj][lane * E]) * scale;
      const float dp = RowDot<E>(dor, &vs[jj][lane * E]);
      const int64_t kp = sp.k_pos0 + j0 + jj;
      if (valid && kp <= pos && kp >= first) {
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

// acc, acc_lse folded with one chunk's out (bf16), lse: Ops::AttentionMerge.
__global__ void MergeKernel(float* acc, float* acc_lse, const uint16_t* out, const float* lse,
                            int64_t s, int64_t h, int64_t d) {
  const int64_t n = s * h * d;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = idx / d, i = row / h, hh = row % h;
    const float la = acc_lse[hh * s + i], lb = lse[hh * s + i];
    if (lb == -INFINITY) continue;
    const float m = fmaxf(la, lb), wa = expf(la - m), wb = expf(lb - m);
    acc[idx] = (acc[idx] * wa + Bf(out[idx]) * wb) / (wa + wb);
  }
}

// The new lse once every element of its row has been merged (a second pass: the first reads it).
__global__ void MergeLseKernel(float* acc_lse, const float* lse, int64_t n) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const float la = acc_lse[idx], lb = lse[idx];
    if (lb == -INFINITY) continue;
    const float m = fmaxf(la, lb);
    acc_lse[idx] = m + logf(expf(la - m) + expf(lb - m));
  }
}

template <int D>
void Forward(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t hq, int64_t hkv,
             uint16_t* out, float* lse, const Mask& mask, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((mask.sp.sq + kRows - 1) / kRows),
                  static_cast<unsigned>(hq));
  ForwardKernel<D><<<grid, kThreads, 0, stream>>>(q, k, v, hq, hkv, out, lse, mask);
  cudaCheckLaunch();
}

template <int D>
void Backward(const uint16_t* q, const uint16_t* k, const uint16_t* v, const uint16_t* dout,
              const float* lse, const float* delta, int64_t hq, int64_t hkv, uint16_t* dq,
              uint16_t* dk, uint16_t* dv, const Mask& mask, cudaStream_t stream) {
  const unsigned k_tiles = static_cast<unsigned>((mask.sp.sk + kRows - 1) / kRows);
  const unsigned q_tiles = static_cast<unsigned>((mask.sp.sq + kRows - 1) / kRows);
  if (k_tiles > 0) {
    DkDvKernel<D><<<dim3(k_tiles, static_cast<unsigned>(hkv)), kThreads, 0, stream>>>(
        q, k, v, dout, lse, delta, hq, hkv, dk, dv, mask);
    cudaCheckLaunch();
  }
  if (q_tiles > 0) {
    DqKernel<D><<<dim3(q_tiles, static_cast<unsigned>(hq)), kThreads, 0, stream>>>(
        q, k, v, dout, lse, delta, hq, hkv, dq, mask);
    cudaCheckLaunch();
  }
}

}  // namespace

bool FlashAttentionSupports(int64_t d) { return d == 16 || d == 32 || d == 64 || d == 128; }

void FlashAttentionChunkForward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                FlashSpan span, int64_t hq, int64_t hkv, int64_t d, uint16_t* out,
                                float* lse, const int64_t* starts, int64_t ndocs,
                                cudaStream_t stream) {
  if (span.sq == 0) return;
  const Mask mask{span, starts, ndocs};
  switch (d) {
    case 16:
      return Forward<16>(q, k, v, hq, hkv, out, lse, mask, stream);
    case 32:
      return Forward<32>(q, k, v, hq, hkv, out, lse, mask, stream);
    case 64:
      return Forward<64>(q, k, v, hq, hkv, out, lse, mask, stream);
    case 128:
      return Forward<128>(q, k, v, hq, hkv, out, lse, mask, stream);
  }
  std::fprintf(stderr, "FlashAttentionForward: head_dim %lld unsupported\n", (long long)d);
  std::abort();
}

void FlashAttentionChunkBackward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                 const uint16_t* out, const uint16_t* dout, const float* lse,
                                 FlashSpan span, int64_t hq, int64_t hkv, int64_t d, float* delta,
                                 uint16_t* dq, uint16_t* dk, uint16_t* dv, const int64_t* starts,
                                 int64_t ndocs, cudaStream_t stream) {
  if (span.sq == 0 && span.sk == 0) return;
  const Mask mask{span, starts, ndocs};
  if (span.sq > 0) {
    DeltaKernel<<<GridFor(span.sq * hq, 256), 256, 0, stream>>>(out, dout, span.sq, hq, d, delta);
    cudaCheckLaunch();
  }
  switch (d) {
    case 16:
      return Backward<16>(q, k, v, dout, lse, delta, hq, hkv, dq, dk, dv, mask, stream);
    case 32:
      return Backward<32>(q, k, v, dout, lse, delta, hq, hkv, dq, dk, dv, mask, stream);
    case 64:
      return Backward<64>(q, k, v, dout, lse, delta, hq, hkv, dq, dk, dv, mask, stream);
    case 128:
      return Backward<128>(q, k, v, dout, lse, delta, hq, hkv, dq, dk, dv, mask, stream);
  }
  std::fprintf(stderr, "FlashAttentionBackward: head_dim %lld unsupported\n", (long long)d);
  std::abort();
}

void FlashAttentionForward(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t s,
                           int64_t hq, int64_t hkv, int64_t d, uint16_t* out, float* lse,
                           const int64_t* starts, int64_t ndocs, cudaStream_t stream) {
  FlashAttentionChunkForward(q, k, v, FlashSpan{s, s, 0, 0, 0}, hq, hkv, d, out, lse, starts, ndocs,
                             stream);
}

void FlashAttentionBackward(const uint16_t* q, const uint16_t* k, const uint16_t* v,
                            const uint16_t* out, const uint16_t* dout, const float* lse, int64_t s,
                            int64_t hq, int64_t hkv, int64_t d, float* delta, uint16_t* dq,
                            uint16_t* dk, uint16_t* dv, const int64_t* starts, int64_t ndocs,
                            cudaStream_t stream) {
  FlashAttentionChunkBackward(q, k, v, out, dout, lse, FlashSpan{s, s, 0, 0, 0}, hq, hkv, d, delta,
                              dq, dk, dv, starts, ndocs, stream);
}

void AttentionMerge(float* acc, float* acc_lse, const uint16_t* out, const float* lse, int64_t s,
                    int64_t h, int64_t d, cudaStream_t stream) {
  if (s * h == 0) return;
  MergeKernel<<<GridFor(s * h * d, 256), 256, 0, stream>>>(acc, acc_lse, out, lse, s, h, d);
  cudaCheckLaunch();
  MergeLseKernel<<<GridFor(s * h, 256), 256, 0, stream>>>(acc_lse, lse, s * h);
  cudaCheckLaunch();
}

}  // namespace cuda
}  // namespace ithaca
