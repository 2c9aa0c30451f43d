// Gemm on the CPU: a blocked, packed (GotoBLAS-style) row-major matrix product, templated on the
// scalar type so the tests can run it in double. Parallel over tiles of C with OpenMP.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace ithaca {
namespace cpu {

namespace gemm_internal {

// Micro-tile of C kept in registers: MR rows × NR columns. 4 × 8 floats fit the 16 SSE registers
// with room for the A broadcasts and B loads, and stay reasonable for wider vectors.
constexpr int64_t kMR = 4;
constexpr int64_t kNR = 8;
// Cache blocking: a KC × NC panel of B (512 KiB in f32) stays in L2/L3 while each MC × KC
// panel of A (64 KiB) is reused from L2 across the NR-wide slivers of B.
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 64;
constexpr int64_t kNC = 512;

// Element (i, p) of op(A), where op(A) is m × k and A is stored row-major with leading dim lda.
template <typename T>
inline T OpAt(const T* a, int64_t ld, bool trans, int64_t row, int64_t col) {
  return trans ? a[col * ld + row] : a[row * ld + col];
}

// Packs rows [i0, i0+mc) × cols [p0, p0+kc) of op(A) into MR-row micro-panels laid out
// [panel][p][r] so the micro-kernel reads them sequentially; rows past mc are zero.
template <typename T>
void PackA(const T* a, int64_t lda, bool trans_a, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
           T* out) {
  for (int64_t ir = 0; ir < mc; ir += kMR) {
    T* panel = out + ir * kc;
    const int64_t rows = std::min(kMR, mc - ir);
    if (trans_a) {
      // op(A) rows are A's columns: read each row of A once, MR elements at a time.
      for (int64_t p = 0; p < kc; ++p) {
        const T* src = a + (p0 + p) * lda + i0 + ir;
        for (int64_t r = 0; r < kMR; ++r) panel[p * kMR + r] = r < rows ? src[r] : T(0);
      }
    } else {
      for (int64_t r = 0; r < kMR; ++r) {
        const T* src = a + (i0 + ir + r) * lda + p0;
        for (int64_t p = 0; p < kc; ++p) panel[p * kMR + r] = r < rows ? src[p] : T(0);
      }
    }
  }
}

// Packs rows [p0, p0+kc) × cols [j0, j0+nc) of op(B) into NR-column micro-panels laid out
// [panel][p][c]; columns past n are zero.
template <typename T>
void PackBPanel(const T* b, int64_t ldb, bool trans_b, int64_t n, int64_t j0, int64_t jr,
                int64_t p0, int64_t kc, T* panel) {
  const int64_t cols = std::min(kNR, n - j0 - jr);
  if (trans_b) {
    // op(B) columns are B's rows: read each contiguously.
    for (int64_t c = 0; c < kNR; ++c) {
      const T* src = b + (j0 + jr + c) * ldb + p0;
      for (int64_t p = 0; p < kc; ++p) panel[p * kNR + c] = c < cols ? src[p] : T(0);
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      const T* src = b + (p0 + p) * ldb + j0 + jr;
      for (int64_t c = 0; c < kNR; ++c) panel[p * kNR + c] = c < cols ? src[c] : T(0);
    }
  }
}

// acc = Σ_p ap[p, :]ᵀ · bp[p, :] over one packed micro-panel pair; fixed trip counts let the
// compiler keep acc in vector registers.
template <typename T>
inline void MicroKernel(int64_t kc, const T* __restrict ap, const T* __restrict bp,
                        T (&acc)[kMR][kNR]) {
  for (int64_t r = 0; r < kMR; ++r) {
    for (int64_t c = 0; c < kNR; ++c) acc[r][c] = T(0);
  }
  for (int64_t p = 0; p < kc; ++p) {
    const T* a = ap + p * kMR;
    const T* b = bp + p * kNR;
    for (int64_t r = 0; r < kMR; ++r) {
      const T ar = a[r];
      for (int64_t c = 0; c < kNR; ++c) acc[r][c] += ar * b[c];
    }
  }
}

}  // namespace gemm_internal

// c = alpha · op(a) · op(b) + beta · c, all row-major: op(a) is m × k, op(b) is k × n, c is m × n,
// with leading dimensions lda, ldb, ldc (elements). op(x) = xᵀ when trans_x, i.e. a is stored
// k × m when trans_a. beta == 0 overwrites c (NaNs already in c do not propagate), as in BLAS.
// c must not overlap a or b.
//
// Threads take whole MT × NC tiles of C (dynamic schedule) and pack their own panels, so the only
// synchronization is the final join: with a shared B panel every K block would need a barrier,
// which stalls badly when the cores are shared with other processes (parallel test runs).
template <typename T>
void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
          int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  using namespace gemm_internal;
  if (m <= 0 || n <= 0) return;
  constexpr int64_t kMT = 2 * kMC;  // rows per tile: packing B costs ~1/kMT of the flops
  const int64_t tiles_m = (m + kMT - 1) / kMT, tiles_n = (n + kNC - 1) / kNC;
  const int64_t kc_max = std::max<int64_t>(1, std::min(k, kKC));
  const int64_t nc_max = (std::min(n, kNC) + kNR - 1) / kNR * kNR;
  const bool multiply = k > 0 && alpha != T(0);
  // Below ~100k multiply-adds a parallel region costs more than it saves.
  const bool parallel = tiles_m * tiles_n > 1 && m * n * std::max<int64_t>(k, 1) > (1 << 17);

#pragma omp parallel if (parallel)
  {
    std::vector<T> apack, bpack;
    if (multiply) {
      apack.resize(static_cast<size_t>(kMC * kc_max));
      bpack.resize(static_cast<size_t>(kc_max * nc_max));
    }
#pragma omp for collapse(2) schedule(dynamic, 1) nowait
    for (int64_t tm = 0; tm < tiles_m; ++tm) {
      for (int64_t tn = 0; tn < tiles_n; ++tn) {
        const int64_t i_begin = tm * kMT, i_end = std::min(m, i_begin + kMT);
        const int64_t j0 = tn * kNC, nc = std::min(kNC, n - j0);
        // Scale the tile of C first so the blocked loop below only ever accumulates.
        for (int64_t i = i_begin; i < i_end; ++i) {
          T* row = c + i * ldc + j0;
          if (beta == T(0)) {
            std::fill(row, row + nc, T(0));
          } else if (beta != T(1)) {
            for (int64_t j = 0; j < nc; ++j) row[j] *= beta;
          }
        }
        if (!multiply) continue;
        for (int64_t p0 = 0; p0 < k; p0 += kKC) {
          const int64_t kc = std::min(kKC, k - p0);
          for (int64_t jr = 0; jr < nc; jr += kNR) {
            PackBPanel(b, ldb, trans_b, n, j0, jr, p0, kc, bpack.data() + jr * kc);
          }
          for (int64_t i0 = i_begin; i0 < i_end; i0 += kMC) {
            const int64_t mc = std::min(kMC, i_end - i0);
            PackA(a, lda, trans_a, i0, mc, p0, kc, apack.data());
            for (int64_t jr = 0; jr < nc; jr += kNR) {
              const T* bp = bpack.data() + jr * kc;
              const int64_t ncols = std::min(kNR, nc - jr);
              for (int64_t ir = 0; ir < mc; ir += kMR) {
                T acc[kMR][kNR];
                MicroKernel(kc, apack.data() + ir * kc, bp, acc);
                const int64_t nrows = std::min(kMR, mc - ir);
                for (int64_t r = 0; r < nrows; ++r) {
                  T* crow = c + (i0 + ir + r) * ldc + j0 + jr;
                  for (int64_t cc = 0; cc < ncols; ++cc) crow[cc] += alpha * acc[r][cc];
                }
              }
            }
          }
        }
      }
    }
  }
}

// The textbook triple loop, accumulating in T; the tests' reference.
template <typename T>
void NaiveGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
               int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      T s = T(0);
      for (int64_t p = 0; p < k; ++p) {
        const T x = gemm_internal::OpAt(a, lda, trans_a, i, p);
        s += x * gemm_internal::OpAt(b, ldb, trans_b, p, j);
      }
      c[i * ldc + j] = alpha * s + (beta == T(0) ? T(0) : beta * c[i * ldc + j]);
    }
  }
}

}  // namespace cpu
}  // namespace ithaca
