// CPU kernels: the math of the Ops interface (except Gemm and attention, in gemm.h and
// attention.h) as plain function templates over raw pointers, so the float instantiations back
// CpuOps and the double ones serve as finite-difference references in the tests.
// Shapes and conventions follow engine/backend/ops.h; callers validate shapes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/backend/ops.h"
#include "engine/core/dtype.h"
#include "engine/core/status.h"

namespace ithaca {
namespace cpu {

// Scalar conversion that knows bf16 (round to nearest even, as in dtype.h).
template <typename To, typename From>
inline To Convert(From x) {
  return static_cast<To>(x);
}
template <>
inline float Convert<float, bf16>(bf16 x) {
  return Bf16ToFloat(x);
}
template <>
inline double Convert<double, bf16>(bf16 x) {
  return Bf16ToFloat(x);
}
template <>
inline bf16 Convert<bf16, float>(float x) {
  return FloatToBf16(x);
}
template <>
inline bf16 Convert<bf16, double>(double x) {
  return FloatToBf16(static_cast<float>(x));
}
template <>
inline bf16 Convert<bf16, bf16>(bf16 x) {
  return x;
}

// Below this many elements an OpenMP region costs more than it saves.
constexpr int64_t kParallelThreshold = 1 << 14;

// ---- Elementwise and reductions.

// y += alpha · x.
template <typename T, typename X>
void Axpy(int64_t n, T alpha, const X* x, T* y) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * Convert<T>(x[i]);
}

// Σ f(x[i]) in double, over fixed-size chunks summed in order, so the result does not depend on
// the number of threads.
template <typename X, typename F>
double ChunkedSum(int64_t n, const X* x, F f) {
  constexpr int64_t kChunk = 8192;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    const int64_t end = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) s += f(Convert<double>(x[i]));
    partial[c] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

template <typename X>
double Sum(int64_t n, const X* x) {
  return ChunkedSum(n, x, [](double v) { return v; });
}

template <typename X>
double SumSquares(int64_t n, const X* x) {
  return ChunkedSum(n, x, [](double v) { return v * v; });
}

// ---- Embedding.

// out[t] = table[ids[t]]: ids [T], table [V, d], out [T, d] written.
template <typename T>
void Embedding(const int32_t* ids, int64_t tokens, const T* table, int64_t vocab, int64_t d,
               T* out) {
  for (int64_t t = 0; t < tokens; ++t) {
    ITHACA_CHECK(ids[t] >= 0 && ids[t] < vocab, "Embedding: id ", ids[t], " at token ", t,
                 " outside [0, ", vocab, ")");
  }
#pragma omp parallel for schedule(static) if (tokens * d > kParallelThreshold)
  for (int64_t t = 0; t < tokens; ++t) {
    std::copy(table + ids[t] * d, table + (ids[t] + 1) * d, out + t * d);
  }
}

// dtable[ids[t]] += dout[t]. Repeated ids collide, so threads split the columns instead of the
// tokens; each column is summed in token order (deterministic).
template <typename T>
void EmbeddingBackward(const int32_t* ids, int64_t tokens, const T* dout, int64_t vocab, int64_t d,
                       T* dtable) {
  for (int64_t t = 0; t < tokens; ++t) {
    ITHACA_CHECK(ids[t] >= 0 && ids[t] < vocab, "EmbeddingBackward: id ", ids[t], " at token ", t,
                 " outside [0, ", vocab, ")");
  }
  constexpr int64_t kCols = 256;
#pragma omp parallel for schedule(static) if (tokens * d > kParallelThreshold)
  for (int64_t c0 = 0; c0 < d; c0 += kCols) {
    const int64_t c1 = std::min(d, c0 + kCols);
    for (int64_t t = 0; t < tokens; ++t) {
      T* dst = dtable + ids[t] * d;
      const T* src = dout + t * d;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

// ---- RMSNorm.

// out = x · rstd · w, rstd = 1 / sqrt(mean(x²) + eps) per row (mean accumulated in double);
// x, out [T, d], w [d], rstd [T] written.
template <typename T, typename R>
void RmsNorm(const T* x, const T* w, int64_t tokens, int64_t d, double eps, T* out, R* rstd) {
#pragma omp parallel for schedule(static) if (tokens * d > kParallelThreshold)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* xr = x + t * d;
    double ss = 0.0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const T r = static_cast<T>(1.0 / std::sqrt(ss / static_cast<double>(d) + eps));
    rstd[t] = static_cast<R>(r);
    T* o = out + t * d;
    for (int64_t i = 0; i < d; ++i) o[i] = xr[i] * r * w[i];
  }
}

// With y = w ⊙ x · r and r = (mean(x²) + eps)^(-1/2):
//   dx = r · (g ⊙ w − x · r² / d · Σ_j g_j w_j x_j)   (accumulated),
//   dw = Σ_t g ⊙ x · r                                 (accumulated).
template <typename T, typename R>
void RmsNormBackward(const T* x, const T* w, const R* rstd, const T* dout, int64_t tokens,
                     int64_t d, T* dx, T* dw) {
  const bool parallel = tokens * d > kParallelThreshold;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* xr = x + t * d;
    const T* g = dout + t * d;
    const T r = static_cast<T>(rstd[t]);
    double dot = 0.0;
    for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(g[i]) * w[i] * xr[i];
    const T c = static_cast<T>(dot / static_cast<double>(d)) * r * r;
    T* dxr = dx + t * d;
    for (int64_t i = 0; i < d; ++i) dxr[i] += r * (g[i] * w[i] - xr[i] * c);
  }
  // dw sums over tokens: split columns across threads so no two threads write the same entry.
  constexpr int64_t kCols = 256;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t c0 = 0; c0 < d; c0 += kCols) {
    const int64_t c1 = std::min(d, c0 + kCols);
    for (int64_t t = 0; t < tokens; ++t) {
      const T r = static_cast<T>(rstd[t]);
      const T* xr = x + t * d;
      const T* g = dout + t * d;
      for (int64_t i = c0; i < c1; ++i) dw[i] += g[i] * xr[i] * r;
    }
  }
}

// ---- Rotary embedding.

// In place on x [T, H, D]: token t is at sample index pos0 + t, and its position pos is that index
// minus the start of its document (doc_starts: num_docs ascending sample indices, the first 0;
// none = one document). For i < D/2 the pair (x_i, x_{i+D/2}) rotates by angle pos · inv_freq[i]
// (−angle when inverse):
//   x_i' = x_i cos − x_{i+D/2} sin,  x_{i+D/2}' = x_{i+D/2} cos + x_i sin   (HF rotate_half).
// The angle is formed in T from T(pos) · T(inv_freq), as Hugging Face does in float32.
template <typename T>
void Rope(T* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t pos0,
          const float* inv_freq, bool inverse, const int64_t* doc_starts = nullptr,
          int64_t num_docs = 0) {
  const int64_t half = head_dim / 2;
#pragma omp parallel if (tokens * heads * head_dim > kParallelThreshold)
  {
    std::vector<T> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t index = pos0 + t;
      int64_t start = 0;
      if (num_docs > 1) start = *(std::upper_bound(doc_starts, doc_starts + num_docs, index) - 1);
      const T pos = static_cast<T>(index - start);
      for (int64_t i = 0; i < half; ++i) {
        const T angle = pos * static_cast<T>(inv_freq[i]);
        cs[i] = std::cos(angle);
        sn[i] = inverse ? -std::sin(angle) : std::sin(angle);
      }
      for (int64_t h = 0; h < heads; ++h) {
        T* lo = x + (t * heads + h) * head_dim;
        T* hi = lo + half;
        for (int64_t i = 0; i < half; ++i) {
          const T a = lo[i], b = hi[i];
          lo[i] = a * cs[i] - b * sn[i];
          hi[i] = b * cs[i] + a * sn[i];
        }
      }
    }
  }
}

// ---- SwiGLU.

template <typename T>
inline T Sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// out = silu(gate) ⊙ up, silu(g) = g · σ(g). Elementwise: out may alias gate or up.
template <typename T>
void SwiGLU(const T* gate, const T* up, int64_t n, T* out) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

// dgate = dout ⊙ up ⊙ σ(g)(1 + g(1 − σ(g))), dup = dout ⊙ silu(g); both written. Each element's
// inputs are read before its outputs are written, so dgate may alias gate and dup may alias up.
template <typename T>
void SwiGLUBackward(const T* gate, const T* up, const T* dout, int64_t n, T* dgate, T* dup) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const T g = gate[i], u = up[i], go = dout[i];
    const T s = Sigmoid(g);
    dgate[i] = go * u * s * (T(1) + g * (T(1) - s));
    dup[i] = go * g * s;
  }
}

// ---- Cross-entropy.

// Per row t: loss = logsumexp(logits[t]) − logits[t, label] (stable: max subtracted, the sum of
// exponentials accumulated in double); dlogits[t] = (softmax − onehot) · grad_scale. label < 0:
// loss 0 and a zero gradient row. dlogits may alias logits (each row is read before written).
template <typename T>
void CrossEntropy(const T* logits, const int32_t* labels, int64_t tokens, int64_t vocab, T* losses,
                  T* dlogits, T grad_scale) {
  for (int64_t t = 0; t < tokens; ++t) {
    ITHACA_CHECK(labels[t] < vocab, "CrossEntropy: label ", labels[t], " at token ", t,
                 " >= vocab ", vocab);
  }
#pragma omp parallel for schedule(static) if (tokens * vocab > kParallelThreshold)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = logits + t * vocab;
    T* drow = dlogits + t * vocab;
    const int32_t label = labels[t];
    if (label < 0) {
      losses[t] = T(0);
      std::fill(drow, drow + vocab, T(0));
      continue;
    }
    T mx = row[0];
    for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
    const double lse = static_cast<double>(mx) + std::log(sum);
    losses[t] = static_cast<T>(lse - static_cast<double>(row[label]));
    const T shift = static_cast<T>(lse);
    for (int64_t j = 0; j < vocab; ++j) drow[j] = std::exp(row[j] - shift) * grad_scale;
    drow[label] -= grad_scale;
  }
}

// Per row t: hits[t] = 1 when labels[t] >= 0 and the first largest logit of the row is at
// labels[t] (torch.argmax's pick), else 0.
template <typename T>
void LabelIsArgmax(const T* logits, const int32_t* labels, int64_t tokens, int64_t vocab, T* hits) {
#pragma omp parallel for schedule(static) if (tokens * vocab > kParallelThreshold)
  for (int64_t t = 0; t < tokens; ++t) {
    const T* row = logits + t * vocab;
    const int32_t label = labels[t];
    if (label < 0 || label >= vocab) {
      hits[t] = T(0);
      continue;
    }
    int64_t best = 0;
    for (int64_t j = 1; j < vocab; ++j) {
      if (row[j] > row[best]) best = j;
    }
    hits[t] = best == label ? T(1) : T(0);
  }
}

// ---- AdamW.

// PyTorch's AdamW (decoupled weight decay), with g = grad_scale · grad:
//   p ← p − lr·wd·p;  m ← β1 m + (1−β1) g;  v ← β2 v + (1−β2) g²;
//   p ← p − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps).
// master, m, v updated in place; working (may be null) gets the new p converted to W.
template <typename T, typename G, typename W>
void AdamW(T* master, const G* grad, T* m, T* v, W* working, int64_t n, const AdamWParams& p) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const T lr = static_cast<T>(p.lr);
  const T decay = T(1) - lr * static_cast<T>(p.weight_decay);
  const T b1 = static_cast<T>(p.beta1), b2 = static_cast<T>(p.beta2);
  const T step_size = static_cast<T>(static_cast<double>(p.lr) / bc1);
  const T inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
  const T eps = static_cast<T>(p.eps), scale = static_cast<T>(p.grad_scale);
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) {
    const T g = Convert<T>(grad[i]) * scale;
    T w = master[i] * decay;
    const T mi = b1 * m[i] + (T(1) - b1) * g;
    const T vi = b2 * v[i] + (T(1) - b2) * g * g;
    w -= step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    m[i] = mi;
    v[i] = vi;
    master[i] = w;
    if (working != nullptr) working[i] = Convert<W>(w);
  }
}

}  // namespace cpu
}  // namespace ithaca
