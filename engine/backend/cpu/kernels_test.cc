// Tests of the layer kernels in kernels.h, run in double: forwards against their defining
// formulas and backwards against central finite differences of L = <forward(x), R>.
#include "engine/backend/cpu/kernels.h"

#include <cmath>

#include "engine/backend/cpu/test_util.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using cpu_test::AllNear;
using cpu_test::Dot;
using cpu_test::NumericGradient;
using cpu_test::Random;

std::vector<double> Minus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

TEST(EmbeddingTest, ForwardGathersRowsAndBackwardAccumulatesRepeatedIds) {
  const int64_t vocab = 5, d = 3;
  const std::vector<int32_t> ids = {1, 3, 1, 0, 4, 1};
  const int64_t tokens = ids.size();
  std::vector<double> table = Random(vocab * d, 1);
  const std::vector<double> r = Random(tokens * d, 2);
  std::vector<double> out(tokens * d);
  cpu::Embedding(ids.data(), tokens, table.data(), vocab, d, out.data());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t c = 0; c < d; ++c) EXPECT_EQ(out[t * d + c], table[ids[t] * d + c]);
  }
  const std::vector<double> init = Random(vocab * d, 3);
  std::vector<double> dtable = init;
  cpu::EmbeddingBackward(ids.data(), tokens, r.data(), vocab, d, dtable.data());
  auto loss = [&] {
    cpu::Embedding(ids.data(), tokens, table.data(), vocab, d, out.data());
    return Dot(out, r);
  };
  EXPECT_TRUE(AllNear(Minus(dtable, init), NumericGradient(loss, &table), 1e-9));
  // Row 2 is never looked up: its gradient stays exactly what it was.
  for (int64_t c = 0; c < d; ++c) EXPECT_EQ(dtable[2 * d + c], init[2 * d + c]);
}

TEST(RmsNormTest, ForwardMatchesDefinition) {
  const int64_t tokens = 3, d = 10;
  const double eps = 1e-5;
  const std::vector<double> x = Random(tokens * d, 4), w = Random(d, 5);
  std::vector<double> out(tokens * d), rstd(tokens);
  cpu::RmsNorm(x.data(), w.data(), tokens, d, eps, out.data(), rstd.data());
  std::vector<double> want(tokens * d);
  for (int64_t t = 0; t < tokens; ++t) {
    double ms = 0.0;
    for (int64_t i = 0; i < d; ++i) ms += x[t * d + i] * x[t * d + i] / d;
    EXPECT_NEAR(rstd[t], 1.0 / std::sqrt(ms + eps), 1e-12);
    for (int64_t i = 0; i < d; ++i) want[t * d + i] = x[t * d + i] / std::sqrt(ms + eps) * w[i];
  }
  EXPECT_TRUE(AllNear(out, want, 1e-12));
}

TEST(RmsNormTest, BackwardAccumulatesFiniteDifferenceGradients) {
  const int64_t tokens = 4, d = 9;
  const double eps = 1e-5;
  std::vector<double> x = Random(tokens * d, 6), w = Random(d, 7, 0.5, 1.5);
  const std::vector<double> r = Random(tokens * d, 8);
  std::vector<double> out(tokens * d), rstd(tokens);
  auto loss = [&] {
    cpu::RmsNorm(x.data(), w.data(), tokens, d, eps, out.data(), rstd.data());
    return Dot(out, r);
  };
  loss();
  const std::vector<double> dx0 = Random(tokens * d, 9), dw0 = Random(d, 10);
  std::vector<double> dx = dx0, dw = dw0;
  cpu::RmsNormBackward(x.data(), w.data(), rstd.data(), r.data(), tokens, d, dx.data(), dw.data());
  EXPECT_TRUE(AllNear(Minus(dx, dx0), NumericGradient(loss, &x), 1e-8));
  EXPECT_TRUE(AllNear(Minus(dw, dw0), NumericGradient(loss, &w), 1e-8));
}

TEST(RopeTest, RotatesPairsHalfADimensionApart) {
  // x = e_i for head dim D = 6 at position pos0 + t: the pair (i, i + 3) rotates by pos·f_i.
  const int64_t d = 6, pos0 = 5;
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f};
  for (int64_t i = 0; i < d / 2; ++i) {
    std::vector<double> x(2 * d, 0.0);  // two tokens, one head
    x[i] = 1.0;
    x[d + i + d / 2] = 1.0;  // token 1: e_{i + D/2}
    cpu::Rope(x.data(), 2, 1, d, pos0, inv_freq.data(), false);
    const double a0 = 5.0 * inv_freq[i], a1 = 6.0 * inv_freq[i];
    std::vector<double> want(2 * d, 0.0);
    want[i] = std::cos(a0);
    want[i + d / 2] = std::sin(a0);
    want[d + i] = -std::sin(a1);
    want[d + i + d / 2] = std::cos(a1);
    EXPECT_TRUE(AllNear(x, want, 1e-7)) << "pair " << i;
  }
}

TEST(RopeTest, InverseIsTheTransposeAndUndoesTheRotation) {
  const int64_t tokens = 7, heads = 3, d = 8, pos0 = 1000;
  const std::vector<float> inv_freq = {1.0f, 0.3f, 0.05f, 0.001f};
  const std::vector<double> x = Random(tokens * heads * d, 11), y = Random(tokens * heads * d, 12);
  std::vector<double> rx = x, ry = y;
  cpu::Rope(rx.data(), tokens, heads, d, pos0, inv_freq.data(), false);
  cpu::Rope(ry.data(), tokens, heads, d, pos0, inv_freq.data(), true);
  EXPECT_NEAR(Dot(rx, y), Dot(x, ry), 1e-12);
  cpu::Rope(rx.data(), tokens, heads, d, pos0, inv_freq.data(), true);
  EXPECT_TRUE(AllNear(rx, x, 1e-12));
  // A rotation, not the identity: the forward did move x.
  std::vector<double> once = x;
  cpu::Rope(once.data(), tokens, heads, d, pos0, inv_freq.data(), false);
  EXPECT_FALSE(AllNear(once, x, 1e-3));
}

TEST(SwiGLUTest, ForwardAndBackwardMatchFiniteDifferences) {
  const int64_t n = 40;
  std::vector<double> gate = Random(n, 13, -4.0, 4.0), up = Random(n, 14);
  const std::vector<double> r = Random(n, 15);
  std::vector<double> out(n);
  cpu::SwiGLU(gate.data(), up.data(), n, out.data());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(out[i], gate[i] / (1.0 + std::exp(-gate[i])) * up[i], 1e-14);
  }
  auto loss = [&] {
    cpu::SwiGLU(gate.data(), up.data(), n, out.data());
    return Dot(out, r);
  };
  // Written, not accumulated: start from garbage.
  std::vector<double> dgate(n, 123.0), dup(n, -7.0);
  cpu::SwiGLUBackward(gate.data(), up.data(), r.data(), n, dgate.data(), dup.data());
  EXPECT_TRUE(AllNear(dgate, NumericGradient(loss, &gate), 1e-8));
  EXPECT_TRUE(AllNear(dup, NumericGradient(loss, &up), 1e-8));
}

TEST(CrossEntropyTest, LossesAndGradientsMatchFiniteDifferences) {
  const int64_t tokens = 5, vocab = 7;
  const std::vector<int32_t> labels = {2, -1, 6, 0, -100};
  std::vector<double> logits = Random(tokens * vocab, 16, -3.0, 3.0);
  std::vector<double> losses(tokens), dlogits(tokens * vocab, 99.0);
  cpu::CrossEntropy(logits.data(), labels.data(), tokens, vocab, losses.data(), dlogits.data(),
                    1.0);
  for (int64_t t = 0; t < tokens; ++t) {
    if (labels[t] < 0) {
      EXPECT_EQ(losses[t], 0.0);
      for (int64_t j = 0; j < vocab; ++j) EXPECT_EQ(dlogits[t * vocab + j], 0.0);
      continue;
    }
    double z = 0.0;
    for (int64_t j = 0; j < vocab; ++j) z += std::exp(logits[t * vocab + j]);
    EXPECT_NEAR(losses[t], std::log(z) - logits[t * vocab + labels[t]], 1e-12);
  }
  auto loss = [&] {
    std::vector<double> l(tokens), g(tokens * vocab);
    cpu::CrossEntropy(logits.data(), labels.data(), tokens, vocab, l.data(), g.data(), 1.0);
    double s = 0.0;
    for (double v : l) s += v;
    return s;
  };
  EXPECT_TRUE(AllNear(dlogits, NumericGradient(loss, &logits), 1e-8));

  // grad_scale multiplies the gradient only; writing in place over the logits gives the same.
  std::vector<double> inplace = logits, scaled_losses(tokens);
  cpu::CrossEntropy(inplace.data(), labels.data(), tokens, vocab, scaled_losses.data(),
                    inplace.data(), 0.25);
  EXPECT_TRUE(AllNear(scaled_losses, losses, 1e-15));
  for (double& g : dlogits) g *= 0.25;
  EXPECT_TRUE(AllNear(inplace, dlogits, 1e-15));
}

TEST(CrossEntropyTest, StableForHugeLogits) {
  const std::vector<double> logits = {1000.0, 999.0, -1000.0};
  const std::vector<int32_t> label = {1};
  double loss = 0.0;
  std::vector<double> grad(3);
  cpu::CrossEntropy(logits.data(), label.data(), 1, 3, &loss, grad.data(), 1.0);
  EXPECT_NEAR(loss, std::log1p(std::exp(-1.0)) + 1.0, 1e-12);
  EXPECT_NEAR(grad[0] + grad[1] + grad[2], 0.0, 1e-12);
  EXPECT_NEAR(grad[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-12);
}

TEST(ReductionTest, SumsInDoubleIndependentlyOfChunking) {
  // Over several chunks. Exact in double; a float accumulator would drop every 2^-20 past 16.
  const int64_t n = 40000;
  std::vector<float> x(n, 1.0f + std::ldexp(1.0f, -20));
  EXPECT_DOUBLE_EQ(cpu::Sum(n, x.data()), n * (1.0 + std::ldexp(1.0, -20)));
  const std::vector<double> y = Random(n, 17);
  double s = 0.0, ss = 0.0;
  for (double v : y) s += v, ss += v * v;
  EXPECT_NEAR(cpu::Sum(n, y.data()), s, 1e-9);
  EXPECT_NEAR(cpu::SumSquares(n, y.data()), ss, 1e-9);
}

}  // namespace
}  // namespace ithaca
