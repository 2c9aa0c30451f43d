// Test helpers for the GPU tests: the no-GPU skip, device tensors from host floats (rounded to
// bf16 where the dtype is bf16, so the CPU oracle sees the very same inputs), and error norms.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/core/dtype.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace cuda_test {

inline bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define SKIP_WITHOUT_GPU()                                                               \
  if (!::ithaca::cuda_test::HaveGpu())                                                   \
  GTEST_SKIP() << "no CUDA GPU on this machine (cudaGetDeviceCount failed or found 0): " \
                  "GPU test skipped"

inline float RoundBf16(float x) { return Bf16ToFloat(FloatToBf16(x)); }

// Normal(0, sigma) values, rounded to bf16 when `bf16` (then exactly representable on both sides).
inline std::vector<float> Randn(int64_t n, uint64_t seed, float sigma = 1.f, bool bf16 = true) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = bf16 ? RoundBf16(dist(gen)) : dist(gen);
  return v;
}

// A device buffer of `dtype` holding `host` (converted).
inline Buffer Dev(CudaOps& ops, Allocator* alloc, DType dtype, Shape shape,
                  const std::vector<float>& host, Tier tier = Tier::kActivations) {
  auto b = Buffer::Make(alloc, dtype, std::move(shape), tier);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(static_cast<size_t>(b->tensor().numel()), host.size());
  ops.Upload(host.data(), DType::kF32, b->tensor());
  return std::move(*b);
}

// An uninitialized-looking device buffer: filled with NaN so unwritten outputs fail the checks.
inline Buffer Poisoned(CudaOps& ops, Allocator* alloc, DType dtype, Shape shape) {
  auto b = Buffer::Make(alloc, dtype, std::move(shape), Tier::kActivations);
  EXPECT_TRUE(b.ok()) << b.status();
  ops.Fill(b->tensor(), std::nanf(""));
  return std::move(*b);
}

inline std::vector<float> Host(CudaOps& ops, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  ops.Download(t, v.data(), DType::kF32);
  return v;
}

inline Tensor CpuT(std::vector<float>& v, Shape s) {
  return Tensor(v.data(), DType::kF32, std::move(s));
}

// ‖got − want‖₂ / ‖want‖₂ (NaN anywhere gives +inf).
inline double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// max |got − want| / max |want|.
inline double MaxRel(const std::vector<float>& got, const std::vector<float>& want) {
  double m = 0, w = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    m = std::max(m, std::fabs(double(got[i]) - want[i]));
    w = std::max(w, std::fabs(double(want[i])));
  }
  return m / std::max(w, 1e-30);
}

// Asserts both norms under `tol` and prints them (the figures the report quotes).
#define EXPECT_CLOSE(got, want, tol, what)                                \
  do {                                                                    \
    const double _l2 = ::ithaca::cuda_test::RelL2(got, want);             \
    const double _mx = ::ithaca::cuda_test::MaxRel(got, want);            \
    std::printf("  %-28s rel_l2 %.3e  max_rel %.3e\n", (what), _l2, _mx); \
    EXPECT_LT(_l2, tol) << (what);                                        \
    EXPECT_LT(_mx, 4 * (tol)) << (what);                                  \
  } while (0)

inline double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::isfinite(x) ? std::fabs(double(x)) : INFINITY);
  return m;
}

// As EXPECT_CLOSE, but where the oracle is exactly zero (dQ and dK when every query sees only
// itself: dS = P ∘ (dP − Dsum) = 0), which no relative error measures: then max |got| must stay
// under `zero_tol` × max |scale| (a related tensor that is not zero, e.g. dV).
#define EXPECT_CLOSE_OR_ZERO(got, want, scale, tol, zero_tol, what)                               \
  do {                                                                                            \
    if (::ithaca::cuda_test::MaxAbs(want) < 1e-30) {                                              \
      const double _z =                                                                           \
          ::ithaca::cuda_test::MaxAbs(got) / std::max(::ithaca::cuda_test::MaxAbs(scale), 1e-30); \
      std::printf("  %-28s oracle exactly 0, max |got| / max |scale| %.3e\n", (what), _z);        \
      EXPECT_LT(_z, zero_tol) << (what);                                                          \
    } else {                                                                                      \
      EXPECT_CLOSE(got, want, tol, what);                                                         \
    }                                                                                             \
  } while (0)

}  // namespace cuda_test
}  // namespace ithaca
