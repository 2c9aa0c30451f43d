// Tests of the blocked CPU Gemm: all transpose combinations against the naive triple loop, its
// gradients (as a linear layer's backward computes them) against finite differences, and the
// CpuOps wrapper in float.
#include "engine/backend/cpu/gemm.h"

#include <cmath>
#include <limits>
#include <tuple>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cpu/test_util.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using cpu_test::AllNear;
using cpu_test::Dot;
using cpu_test::Random;

class GemmTransposeTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

// Sizes straddle every blocking boundary: m over MC and not a multiple of MR, n over NC and not
// a multiple of NR, k over KC.
TEST_P(GemmTransposeTest, MatchesNaiveInDouble) {
  const auto [ta, tb] = GetParam();
  const int64_t m = 70, n = 530, k = 261;
  const std::vector<double> a = Random(m * k, 1), b = Random(k * n, 2), c0 = Random(m * n, 3);
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  for (const auto& [alpha, beta] :
       {std::pair<double, double>{1.0, 0.0}, {0.5, 1.0}, {-2.0, 0.25}}) {
    std::vector<double> got = c0, want = c0;
    cpu::Gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, got.data(), n);
    cpu::NaiveGemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, want.data(), n);
    EXPECT_TRUE(AllNear(got, want, 1e-12, 1e-12)) << "alpha " << alpha << " beta " << beta;
  }
}

// L = <op(A) op(B), R>. The gradients a linear layer takes with the same Gemm:
//   d op(A) = R op(B)ᵀ, d op(B) = op(A)ᵀ R, transposed back when A or B is stored transposed.
TEST_P(GemmTransposeTest, GradientsMatchFiniteDifferences) {
  const auto [ta, tb] = GetParam();
  const int64_t m = 5, n = 7, k = 6;
  std::vector<double> a = Random(m * k, 4), b = Random(k * n, 5);
  const std::vector<double> r = Random(m * n, 6);
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  auto loss = [&] {
    std::vector<double> c(m * n);
    cpu::Gemm(ta, tb, m, n, k, 1.0, a.data(), lda, b.data(), ldb, 0.0, c.data(), n);
    return Dot(c, r);
  };
  std::vector<double> da(m * k), db(k * n);
  if (!ta) {
    cpu::Gemm(false, !tb, m, k, n, 1.0, r.data(), n, b.data(), ldb, 0.0, da.data(), k);
  } else {
    cpu::Gemm(tb, true, k, m, n, 1.0, b.data(), ldb, r.data(), n, 0.0, da.data(), m);
  }
  if (!tb) {
    cpu::Gemm(!ta, false, k, n, m, 1.0, a.data(), lda, r.data(), n, 0.0, db.data(), n);
  } else {
    cpu::Gemm(true, ta, n, k, m, 1.0, r.data(), n, a.data(), lda, 0.0, db.data(), k);
  }
  EXPECT_TRUE(AllNear(da, cpu_test::NumericGradient(loss, &a), 1e-8));
  EXPECT_TRUE(AllNear(db, cpu_test::NumericGradient(loss, &b), 1e-8));
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, GemmTransposeTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(GemmTest, BetaZeroIgnoresNaNInC) {
  const std::vector<double> a = Random(3 * 4, 7), b = Random(4 * 2, 8);
  std::vector<double> c(3 * 2, std::numeric_limits<double>::quiet_NaN()), want(3 * 2);
  cpu::Gemm(false, false, 3, 2, 4, 1.0, a.data(), 4, b.data(), 2, 0.0, c.data(), 2);
  cpu::NaiveGemm(false, false, 3, 2, 4, 1.0, a.data(), 4, b.data(), 2, 0.0, want.data(), 2);
  EXPECT_TRUE(AllNear(c, want, 1e-14));
}

TEST(GemmTest, ZeroInnerDimensionOnlyScalesC) {
  std::vector<double> c = {1.0, 2.0, 3.0, 4.0};
  cpu::Gemm<double>(false, false, 2, 2, 0, 1.0, nullptr, 0, nullptr, 2, 3.0, c.data(), 2);
  EXPECT_TRUE(AllNear(c, std::vector<double>{3.0, 6.0, 9.0, 12.0}, 0.0));
}

// CpuOps views leading dims as rows: a [2, 3, K] is a 6 × K matrix, [3, K/3, 6] is K × 6.
TEST(CpuOpsGemmTest, FloatMatchesDoubleForAllTransposes) {
  CpuOps ops;
  const int64_t m = 6, n = 37, k = 300;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::vector<double> a = Random(m * k, 9), b = Random(k * n, 10), c0 = Random(m * n, 11);
      std::vector<float> af = cpu_test::ToFloat(a), bf = cpu_test::ToFloat(b);
      std::vector<float> cf = cpu_test::ToFloat(c0);
      const Shape sa = ta ? Shape{3, k / 3, m} : Shape{2, 3, k};
      const Shape sb = tb ? Shape{n, k} : Shape{k, n};
      ops.Gemm(Tensor(af.data(), DType::kF32, sa), ta, Tensor(bf.data(), DType::kF32, sb), tb,
               Tensor(cf.data(), DType::kF32, {m, n}), 0.75f, 0.5f);
      std::vector<double> want = c0;
      cpu::NaiveGemm(ta, tb, m, n, k, 0.75, a.data(), ta ? m : k, b.data(), tb ? k : n, 0.5,
                     want.data(), n);
      // Float inputs round a and b by 2^-24 relative; k = 300 products of O(1) terms.
      EXPECT_TRUE(AllNear(cf, want, 2e-4)) << "ta " << ta << " tb " << tb;
    }
  }
}

TEST(CpuOpsGemmDeathTest, RejectsMismatchedShapes) {
  // Re-exec rather than fork: forking a process with a live OpenMP pool is unsafe.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CpuOps ops;
  std::vector<float> a(6), b(6), c(4);
  EXPECT_DEATH(
      ops.Gemm(Tensor(a.data(), DType::kF32, {2, 3}), false, Tensor(b.data(), DType::kF32, {2, 3}),
               false, Tensor(c.data(), DType::kF32, {2, 2}), 1.0f, 0.0f),
      "Gemm: op\\(a\\) 2x3");
}

}  // namespace
}  // namespace ithaca
