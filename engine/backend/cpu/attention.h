// Causal GQA attention on the CPU, flash-style: queries and keys are visited in blocks with an
// online softmax, so no S × S matrix is ever formed (per-thread scratch is O(block · D)).
// Optionally document-masked (packed samples): a query sees only the keys at or before it in its
// own document, and key blocks wholly before a query block's first document are skipped.
// Optionally windowed (Mistral's sliding window W): a query also sees only its last W keys
// (itself included), and key blocks wholly before a query block's first window are skipped.
// Templated on the scalar type so the tests can run it in double.
//
// Layouts (tokens lead): q, out, dout, dq [S, Hq, D]; k, v, dk, dv [S, Hkv, D]; lse [Hq, S].
// Query head h reads K/V head h / (Hq / Hkv). Logits are scaled by 1/sqrt(D).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/backend/cpu/attention_blocks.h"

namespace ithaca {
namespace cpu {

namespace attention_internal {

// Copies keys [j0, j0 + nk) of head g transposed into out [D][bk], so a query row's dot
// products with the block's keys become a contiguous, vectorizable loop over keys.
template <typename T>
void PackTransposed(const T* x, int64_t j0, int64_t nk, int64_t g, int64_t hkv, int64_t d,
                    int64_t bk, T* out) {
  for (int64_t jj = 0; jj < nk; ++jj) {
    const T* row = x + ((j0 + jj) * hkv + g) * d;
    for (int64_t e = 0; e < d; ++e) out[e * bk + jj] = row[e];
  }
}

// Copies keys [j0, j0 + nk) of head g into out [nk][D] (contiguous rows).
template <typename T>
void PackRows(const T* x, int64_t j0, int64_t nk, int64_t g, int64_t hkv, int64_t d, T* out) {
  for (int64_t jj = 0; jj < nk; ++jj) {
    std::copy(x + ((j0 + jj) * hkv + g) * d, x + ((j0 + jj) * hkv + g + 1) * d, out + jj * d);
  }
}

// out[jj] = Σ_e row[e] · xt[e][jj] for a ≤ jj < n.
template <typename T>
inline void RowTimesTransposed(const T* row, const T* xt, int64_t a, int64_t n, int64_t d,
                               int64_t bk, T* out) {
  std::fill(out + a, out + n, T(0));
  for (int64_t e = 0; e < d; ++e) {
    const T re = row[e];
    const T* col = xt + e * bk;
    for (int64_t jj = a; jj < n; ++jj) out[jj] += re * col[jj];
  }
}

// y[:] += a · x[:] over d elements.
template <typename T>
inline void AxpyRow(T a, const T* x, int64_t d, T* y) {
  for (int64_t e = 0; e < d; ++e) y[e] += a * x[e];
}

// Keys of block [j0, ...) visible to query i under the causal mask, capped at nk (may be ≤ 0).
inline int64_t VisibleKeys(int64_t i, int64_t j0, int64_t nk) { return std::min(nk, i - j0 + 1); }

// The document structure (and sliding window) as per-token bounds: First(i) is the first key
// query i may see (the start of its document, or i − window + 1 when that is later) and End(j)
// one past the last query that may see key j (the end of its document, or j + window when that
// is sooner). Without documents or window First = 0 and End = s. Both are non-decreasing.
struct DocumentBounds {
  std::vector<int64_t> first, end;
  int64_t window = 0;
  DocumentBounds(int64_t s, const int64_t* starts, int64_t num_docs, int64_t w = 0) : window(w) {
    if (num_docs <= 1) return;
    first.resize(static_cast<size_t>(s));
    end.resize(static_cast<size_t>(s));
    // Documents may run past s (a chunk's view of a longer sample): clipped to it.
    for (int64_t di = 0; di < num_docs && starts[di] < s; ++di) {
      const int64_t lo = starts[di], hi = di + 1 < num_docs ? std::min(s, starts[di + 1]) : s;
      for (int64_t i = lo; i < hi; ++i) {
        first[i] = lo;
        end[i] = hi;
      }
    }
  }
  int64_t First(int64_t i) const {
    const int64_t doc = first.empty() ? 0 : first[i];
    return window > 0 ? std::max(doc, i - window + 1) : doc;
  }
  int64_t End(int64_t j, int64_t s) const {
    const int64_t doc = end.empty() ? s : end[j];
    return window > 0 ? std::min(doc, j + window) : doc;
  }
};

// Keys of block [j0, ...) hidden from query i by its document or window: the first
// max(0, First(i) − j0).
inline int64_t HiddenKeys(const DocumentBounds& docs, int64_t i, int64_t j0) {
  return std::max<int64_t>(0, docs.First(i) - j0);
}

// Tiny problems (most unit tests) run on one thread: a parallel region costs more than it saves.
inline bool WorthParallel(int64_t s, int64_t hq, int64_t d) { return s * s * hq * d > (1 << 16); }

}  // namespace attention_internal

// Where a chunk of queries and a chunk of keys sit in the sample (ring attention): queries
// [q_pos0, q_pos0 + sq), keys [k_pos0, k_pos0 + sk). The whole sample: {s, s, 0, 0}.
struct AttentionSpan {
  int64_t sq = 0, sk = 0;
  int64_t q_pos0 = 0, k_pos0 = 0;
  // The sample length the document starts are read against: up to the later chunk's end.
  int64_t extent() const { return std::max(q_pos0 + sq, k_pos0 + sk); }
};

// out and lse (natural log of Σ_j exp(q·k_j / sqrt(D)), over visible keys) written for the
// span's queries against its keys; a query that sees no key gets out 0 and lse −inf.
// doc_starts: num_docs ascending sample positions, the first 0 (none: one document).
// window > 0: each query's last `window` keys at most.
template <typename T>
void AttentionChunkForward(const T* q, const T* k, const T* v, AttentionSpan span, int64_t hq,
                           int64_t hkv, int64_t d, T* out, T* lse, AttentionBlocks blocks = {},
                           const int64_t* doc_starts = nullptr, int64_t num_docs = 0,
                           int64_t window = 0) {
  using namespace attention_internal;
  const int64_t sq = span.sq, sk = span.sk, qp0 = span.q_pos0, kp0 = span.k_pos0;
  const DocumentBounds docs(span.extent(), doc_starts, num_docs, window);
  const int64_t group = hq / hkv;
  const int64_t bq = blocks.q, bk = blocks.k;
  const int64_t nqb = (sq + bq - 1) / bq;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
#pragma omp parallel if (WorthParallel(std::max(sq, sk), hq, d))
  {
    std::vector<T> kt(static_cast<size_t>(d * bk)), vb(static_cast<size_t>(bk * d));
    std::vector<T> acc(static_cast<size_t>(bq * d)), srow(static_cast<size_t>(bk));
    std::vector<T> mrow(static_cast<size_t>(bq)), lrow(static_cast<size_t>(bq));
    // Causal blocks differ in cost (later query blocks see more keys): schedule dynamically.
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t qb = 0; qb < nqb; ++qb) {
        const int64_t g = h / group;
        const int64_t i0 = qb * bq, nq = std::min(bq, sq - i0);
        std::fill(acc.begin(), acc.end(), T(0));
        std::fill(mrow.begin(), mrow.end(), -std::numeric_limits<T>::infinity());
        std::fill(lrow.begin(), lrow.end(), T(0));
        // Keys past the block's last query are masked for all its rows: stop there; keys before
        // its first row's document are masked for all of them too: start at their block.
        const int64_t j_begin = std::clamp<int64_t>(docs.First(qp0 + i0) - kp0, 0, sk) / bk * bk;
        const int64_t j_end = std::clamp<int64_t>(qp0 + i0 + nq - kp0, 0, sk);
        for (int64_t j0 = j_begin; j0 < j_end; j0 += bk) {
          const int64_t nk = std::min(bk, j_end - j0);
          PackTransposed(k, j0, nk, g, hkv, d, bk, kt.data());
          PackRows(v, j0, nk, g, hkv, d, vb.data());
          for (int64_t ii = 0; ii < nq; ++ii) {
            const int64_t pos = qp0 + i0 + ii;
            const int64_t n = VisibleKeys(pos, kp0 + j0, nk), a0 = HiddenKeys(docs, pos, kp0 + j0);
            if (n <= a0) continue;
            RowTimesTransposed(q + ((i0 + ii) * hq + h) * d, kt.data(), a0, n, d, bk, srow.data());
            T mx = mrow[ii];
            for (int64_t jj = a0; jj < n; ++jj) {
              srow[jj] *= scale;
              mx = std::max(mx, srow[jj]);
            }
            // Online softmax: rescale what was accumulated under the previous running max.
            const T corr = std::exp(mrow[ii] - mx);
            T* a = acc.data() + ii * d;
            T l = lrow[ii] * corr;
            for (int64_t e = 0; e < d; ++e) a[e] *= corr;
            for (int64_t jj = a0; jj < n; ++jj) {
              const T p = std::exp(srow[jj] - mx);
              l += p;
              AxpyRow(p, vb.data() + jj * d, d, a);
            }
            mrow[ii] = mx;
            lrow[ii] = l;
          }
        }
        for (int64_t ii = 0; ii < nq; ++ii) {
          T* o = out + ((i0 + ii) * hq + h) * d;
          if (lrow[ii] == T(0)) {  // no visible key in this chunk
            std::fill(o, o + d, T(0));
            lse[h * sq + i0 + ii] = -std::numeric_limits<T>::infinity();
            continue;
          }
          const T inv = T(1) / lrow[ii];
          for (int64_t e = 0; e < d; ++e) o[e] = acc[ii * d + e] * inv;
          lse[h * sq + i0 + ii] = mrow[ii] + std::log(lrow[ii]);
        }
      }
    }
  }
}

// The whole sample's causal attention: the span of every query against every key.
template <typename T>
void AttentionForward(const T* q, const T* k, const T* v, int64_t s, int64_t hq, int64_t hkv,
                      int64_t d, T* out, T* lse, AttentionBlocks blocks = {},
                      const int64_t* doc_starts = nullptr, int64_t num_docs = 0,
                      int64_t window = 0) {
  AttentionChunkForward(q, k, v, AttentionSpan{s, s, 0, 0}, hq, hkv, d, out, lse, blocks,
                        doc_starts, num_docs, window);
}

// Gradients of the chunk forward above; dq, dk, dv written (dk, dv summed over a GQA group).
// `out` and `lse` are the whole rows' (over every key chunk: the softmax's denominator is the
// row's), so the chunks' gradients add up to the whole attention's.
// P is recomputed from q, k and lse; with Di = rowsum(dO ∘ O) and dS = P ∘ (dP − Di):
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dQ = scale · dS K,  dK = scale · dSᵀ Q.
// Two passes keep every output owned by one thread (race-free and deterministic): pass 1 runs
// over (K/V head, key block) and accumulates dk, dv; pass 2 over (query head, query block) and
// accumulates dq. The price is computing P and dP twice.
template <typename T>
void AttentionChunkBackward(const T* q, const T* k, const T* v, const T* out, const T* dout,
                            const T* lse, AttentionSpan span, int64_t hq, int64_t hkv, int64_t d,
                            T* dq, T* dk, T* dv, AttentionBlocks blocks = {},
                            const int64_t* doc_starts = nullptr, int64_t num_docs = 0,
                            int64_t window = 0) {
  using namespace attention_internal;
  const int64_t sq = span.sq, sk = span.sk, qp0 = span.q_pos0, kp0 = span.k_pos0;
  const int64_t extent = span.extent();
  const DocumentBounds docs(extent, doc_starts, num_docs, window);
  const int64_t group = hq / hkv;
  const int64_t bq = blocks.q, bk = blocks.k;
  const int64_t nqb = (sq + bq - 1) / bq, nkb = (sk + bk - 1) / bk;
  const T scale = T(1) / std::sqrt(static_cast<T>(d));
  const bool parallel = WorthParallel(std::max(sq, sk), hq, d);

  // di[h][i] = Σ_e dO[i, h, e] · O[i, h, e].
  std::vector<T> di(static_cast<size_t>(hq * sq));
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t h = 0; h < hq; ++h) {
      const T* o = out + (i * hq + h) * d;
      const T* go = dout + (i * hq + h) * d;
      T sum = T(0);
      for (int64_t e = 0; e < d; ++e) sum += o[e] * go[e];
      di[h * sq + i] = sum;
    }
  }

#pragma omp parallel if (parallel)
  {
    std::vector<T> kt(static_cast<size_t>(d * bk)), vt(static_cast<size_t>(d * bk));
    std::vector<T> kb(static_cast<size_t>(bk * d));
    std::vector<T> acc_a(static_cast<size_t>(std::max(bq, bk) * d));
    std::vector<T> acc_b(static_cast<size_t>(bk * d));
    std::vector<T> p(static_cast<size_t>(bk)), ds(static_cast<size_t>(bk));

    // P and dS for query row i (head h) against the packed key block, over its visible keys
    // [a, n).
    auto probs = [&](int64_t h, int64_t i, int64_t a, int64_t n) {
      const T* qi = q + (i * hq + h) * d;
      const T* gi = dout + (i * hq + h) * d;
      RowTimesTransposed(qi, kt.data(), a, n, d, bk, p.data());
      RowTimesTransposed(gi, vt.data(), a, n, d, bk, ds.data());  // dP, turned into dS below
      const T l = lse[h * sq + i], dii = di[h * sq + i];
      for (int64_t jj = a; jj < n; ++jj) {
        p[jj] = std::exp(p[jj] * scale - l);
        ds[jj] = p[jj] * (ds[jj] - dii);
      }
    };

    // Pass 1: dk, dv for key block kblk of K/V head g, from every query row at or after the
    // block's first key that is not past the document (or window) of the block's last key.
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t g = 0; g < hkv; ++g) {
      for (int64_t kblk = 0; kblk < nkb; ++kblk) {
        const int64_t j0 = kblk * bk, nk = std::min(bk, sk - j0);
        PackTransposed(k, j0, nk, g, hkv, d, bk, kt.data());
        PackTransposed(v, j0, nk, g, hkv, d, bk, vt.data());
        T* dk_acc = acc_a.data();
        T* dv_acc = acc_b.data();
        std::fill(dk_acc, dk_acc + nk * d, T(0));
        std::fill(dv_acc, dv_acc + nk * d, T(0));
        const int64_t i_begin = std::clamp<int64_t>(kp0 + j0 - qp0, 0, sq);
        const int64_t i_end = std::clamp<int64_t>(docs.End(kp0 + j0 + nk - 1, extent) - qp0, 0, sq);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          for (int64_t i = i_begin; i < i_end; ++i) {
            const int64_t pos = qp0 + i;
            const int64_t n = VisibleKeys(pos, kp0 + j0, nk), a = HiddenKeys(docs, pos, kp0 + j0);
            if (n <= a) continue;
            probs(h, i, a, n);
            const T* qi = q + (i * hq + h) * d;
            const T* gi = dout + (i * hq + h) * d;
            for (int64_t jj = a; jj < n; ++jj) {
              AxpyRow(p[jj], gi, d, dv_acc + jj * d);
              AxpyRow(scale * ds[jj], qi, d, dk_acc + jj * d);
            }
          }
        }
        for (int64_t jj = 0; jj < nk; ++jj) {
          std::copy(dk_acc + jj * d, dk_acc + (jj + 1) * d, dk + ((j0 + jj) * hkv + g) * d);
          std::copy(dv_acc + jj * d, dv_acc + (jj + 1) * d, dv + ((j0 + jj) * hkv + g) * d);
        }
      }
    }

    // Pass 2: dq for query block qblk of head h, from every visible key block.
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t qblk = 0; qblk < nqb; ++qblk) {
        const int64_t g = h / group;
        const int64_t i0 = qblk * bq, nq = std::min(bq, sq - i0);
        T* dq_acc = acc_a.data();
        std::fill(dq_acc, dq_acc + nq * d, T(0));
        const int64_t j_begin = std::clamp<int64_t>(docs.First(qp0 + i0) - kp0, 0, sk) / bk * bk;
        const int64_t j_end = std::clamp<int64_t>(qp0 + i0 + nq - kp0, 0, sk);
        for (int64_t j0 = j_begin; j0 < j_end; j0 += bk) {
          const int64_t nk = std::min(bk, j_end - j0);
          PackTransposed(k, j0, nk, g, hkv, d, bk, kt.data());
          PackTransposed(v, j0, nk, g, hkv, d, bk, vt.data());
          PackRows(k, j0, nk, g, hkv, d, kb.data());
          for (int64_t ii = 0; ii < nq; ++ii) {
            const int64_t pos = qp0 + i0 + ii;
            const int64_t n = VisibleKeys(pos, kp0 + j0, nk), a = HiddenKeys(docs, pos, kp0 + j0);
            if (n <= a) continue;
            probs(h, i0 + ii, a, n);
            for (int64_t jj = a; jj < n; ++jj) {
              AxpyRow(scale * ds[jj], kb.data() + jj * d, d, dq_acc + ii * d);
            }
          }
        }
        for (int64_t ii = 0; ii < nq; ++ii) {
          std::copy(dq_acc + ii * d, dq_acc + (ii + 1) * d, dq + ((i0 + ii) * hq + h) * d);
        }
      }
    }
  }
}

template <typename T>
void AttentionBackward(const T* q, const T* k, const T* v, const T* out, const T* dout,
                       const T* lse, int64_t s, int64_t hq, int64_t hkv, int64_t d, T* dq, T* dk,
                       T* dv, AttentionBlocks blocks = {}, const int64_t* doc_starts = nullptr,
                       int64_t num_docs = 0, int64_t window = 0) {
  AttentionChunkBackward(q, k, v, out, dout, lse, AttentionSpan{s, s, 0, 0}, hq, hkv, d, dq, dk, dv,
                         blocks, doc_starts, num_docs, window);
}

// Folds one chunk's (out, lse) into the running (acc, acc_lse) of the same rows: see
// Ops::AttentionMerge. Layouts: acc, out [S, H, D]; acc_lse, lse [H, S].
template <typename T>
void AttentionMerge(T* acc, T* acc_lse, const T* out, const T* lse, int64_t s, int64_t h,
                    int64_t d) {
  for (int64_t i = 0; i < s; ++i) {
    for (int64_t hh = 0; hh < h; ++hh) {
      const T la = acc_lse[hh * s + i], lb = lse[hh * s + i];
      if (lb == -std::numeric_limits<T>::infinity()) continue;  // the chunk adds nothing
      const T m = std::max(la, lb);
      const T wa = std::exp(la - m), wb = std::exp(lb - m), sum = wa + wb;
      T* a = acc + (i * h + hh) * d;
      const T* o = out + (i * h + hh) * d;
      for (int64_t e = 0; e < d; ++e) a[e] = (a[e] * wa + o[e] * wb) / sum;
      acc_lse[hh * s + i] = m + std::log(sum);
    }
  }
}

}  // namespace cpu
}  // namespace ithaca
