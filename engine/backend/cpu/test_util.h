// Test-only helpers for the CPU kernel tests: seeded random data, central finite differences,
// and element-wise comparisons that name the first mismatching index.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ithaca {
namespace cpu_test {

inline std::vector<double> Random(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = dist(gen);
  return v;
}

inline std::vector<float> ToFloat(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

inline std::vector<double> ToDouble(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d loss / d x[i] for every i by central differences; x is perturbed in place and restored.
inline std::vector<double> NumericGradient(const std::function<double()>& loss,
                                           std::vector<double>* x, double h = 1e-5) {
  std::vector<double> grad(x->size());
  for (size_t i = 0; i < x->size(); ++i) {
    const double saved = (*x)[i];
    (*x)[i] = saved + h;
    const double plus = loss();
    (*x)[i] = saved - h;
    const double minus = loss();
    (*x)[i] = saved;
    grad[i] = (plus - minus) / (2.0 * h);
  }
  return grad;
}

// Passes when |got − want| <= atol + rtol · |want| everywhere; reports the worst element.
template <typename A, typename B>
::testing::AssertionResult AllNear(const std::vector<A>& got, const std::vector<B>& want,
                                   double atol, double rtol = 0.0) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << want.size();
  }
  double worst = 0.0;
  size_t worst_i = 0;
  bool ok = true;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (!(excess <= 0.0)) {  // also catches NaN
      if (ok || excess > worst) {
        worst = excess;
        worst_i = i;
      }
      ok = false;
    }
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "worst mismatch at [" << worst_i << "]: got " << static_cast<double>(got[worst_i])
         << ", want " << static_cast<double>(want[worst_i]) << " (atol " << atol << ", rtol "
         << rtol << ")";
}

// Largest |x|, to scale tolerances.
template <typename A>
double MaxAbs(const std::vector<A>& v) {
  double m = 0.0;
  for (const A& x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

}  // namespace cpu_test
}  // namespace ithaca
