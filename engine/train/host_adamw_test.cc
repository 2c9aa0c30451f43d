// The CPU AdamW of optimizer offload: against the AdamW formula in double precision, bit for bit
// against the CPU backend's AdamW (cpu::AdamW, what the on-device optimizer runs there), the
// AVX2 loop against the scalar one, and the thread pool's cover of a range.
#include "engine/train/host_adamw.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <random>

#include "engine/backend/cpu/kernels.h"

namespace ithaca {
namespace {

struct State {
  std::vector<float> master, grad, m, v;
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  explicit State(int64_t n, uint32_t seed) : master(n), grad(n), m(n), v(n), bf16(n), f32(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> w(0.f, 0.05f), g(0.f, 1e-3f);
    for (int64_t i = 0; i < n; ++i) {
      master[i] = w(rng);
      grad[i] = g(rng);
    }
    // A few elements far from the rest: zero, huge and tiny gradients.
    if (n > 3) {
      grad[0] = 0.f;
      grad[1] = 3e4f;
      grad[2] = 1e-30f;
    }
  }
  HostAdamWSpan Span(DType working) {
    HostAdamWSpan s;
    s.master = master.data();
    s.grad = grad.data();
    s.m = m.data();
    s.v = v.data();
    s.working = working == DType::kBF16 ? static_cast<void*>(bf16.data()) : f32.data();
    s.working_dtype = working;
    s.n = static_cast<int64_t>(master.size());
    return s;
  }
  void NewGradient(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.f, 1e-3f);
    for (float& x : grad) x = g(rng);
  }
};

AdamWParams Params(int64_t step) {
  AdamWParams p;
  p.lr = 3e-4f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.1f;
  p.grad_scale = 0.37f;  // clipping engaged
  p.step = step;
  return p;
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t x, y;
    std::memcpy(&x, &a[i], 4);
    std::memcpy(&y, &b[i], 4);
    ASSERT_EQ(x, y) << what << "[" << i << "]: " << a[i] << " vs " << b[i];
  }
}

// 5 steps of the host AdamW (pooled, vectorized) and of cpu::AdamW from the same state: the
// same bits in master, m, v and the working copy, for a bf16 and an f32 working copy, at a size
// with a tail that is no multiple of 8 nor of the pool's grain.
TEST(HostAdamWTest, MatchesTheCpuBackendBitForBit) {
  HostThreadPool pool(4);
  for (DType working : {DType::kBF16, DType::kF32}) {
    const int64_t n = 100003;
    State host(n, 7), ref(n, 7);
    for (int64_t step = 1; step <= 5; ++step) {
      host.NewGradient(100 + step);
      ref.NewGradient(100 + step);
      const AdamWParams p = Params(step);
      HostAdamW(host.Span(working), p, &pool);
      if (working == DType::kBF16) {
        cpu::AdamW(ref.master.data(), ref.grad.data(), ref.m.data(), ref.v.data(),
                   reinterpret_cast<bf16*>(ref.bf16.data()), n, p);
      } else {
        cpu::AdamW(ref.master.data(), ref.grad.data(), ref.m.data(), ref.v.data(), ref.f32.data(),
                   n, p);
      }
    }
    ExpectSameBits(host.master, ref.master, "master");
    ExpectSameBits(host.m, ref.m, "m");
    ExpectSameBits(host.v, ref.v, "v");
    if (working == DType::kBF16) {
      EXPECT_EQ(host.bf16, ref.bf16);
    } else {
      ExpectSameBits(host.f32, ref.f32, "working");
    }
  }
}

TEST(HostAdamWTest, VectorizedEqualsScalar) {
  if (!HostAdamWVectorized()) GTEST_SKIP() << "no AVX2 on this CPU: only the scalar loop runs";
  const int64_t n = 4099;
  State a(n, 3), b(n, 3);
  a.master[5] = std::nanf("");  // a NaN stays a (quiet) NaN in the bf16 copy, as FloatToBf16
  b.master[5] = std::nanf("");
  const AdamWParams p = Params(2);
  HostAdamWRange(a.Span(DType::kBF16), p, 0, n, /*vectorized=*/true);
  HostAdamWRange(b.Span(DType::kBF16), p, 0, n, /*vectorized=*/false);
  ExpectSameBits(a.m, b.m, "m");
  ExpectSameBits(a.v, b.v, "v");
  EXPECT_EQ(a.bf16, b.bf16);
  EXPECT_EQ(a.bf16[5], FloatToBf16(a.master[5]).bits);
  for (int64_t i = 0; i < n; ++i) {
    if (i == 5) continue;
    ASSERT_EQ(a.master[i], b.master[i]) << i;
    ASSERT_EQ(a.bf16[i], FloatToBf16(a.master[i]).bits) << i;
  }
}

// PyTorch's AdamW in double precision (decoupled weight decay, bias-corrected moments): the f32
// update agrees to f32 rounding over several steps.
TEST(HostAdamWTest, AgreesWithTheFormulaInDoublePrecision) {
  const int64_t n = 20000;
  State s(n, 11);
  std::vector<double> w(s.master.begin(), s.master.end()), m(n, 0.0), v(n, 0.0);
  // m sums gradients of either sign, so its f32 error is relative to the sum of |terms|: this
  // moving average of |g| bounds it.
  std::vector<double> envelope(n, 0.0);
  HostThreadPool pool(3);
  for (int64_t t = 1; t <= 6; ++t) {
    s.NewGradient(200 + t);
    const AdamWParams p = Params(t);
    HostAdamW(s.Span(DType::kBF16), p, &pool);
    const double b1 = p.beta1, b2 = p.beta2, lr = p.lr;
    for (int64_t i = 0; i < n; ++i) {
      const double g = double(s.grad[i]) * double(p.grad_scale);
      w[i] -= lr * double(p.weight_decay) * w[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      envelope[i] = b1 * envelope[i] + (1 - b1) * std::abs(g);
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, double(t)));
      const double vhat = v[i] / (1 - std::pow(b2, double(t)));
      w[i] -= lr * mhat / (std::sqrt(vhat) + double(p.eps));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    // f32 keeps ~2^-24 of each value per operation, a few dozen operations in all; an update
    // (at most ~lr a step) inherits m's relative error. A wrong formula (bias correction, decay,
    // eps) is off by a good fraction of lr = 3e-4.
    const double tol = 1e-6 * std::abs(w[i]) + 6 * 3e-4 * 1e-4;
    ASSERT_NEAR(s.master[i], w[i], tol) << i;
    ASSERT_NEAR(s.m[i], m[i], 1e-6 * envelope[i] + 1e-30) << i;
    ASSERT_NEAR(s.v[i], v[i], 1e-5 * std::abs(v[i]) + 1e-30) << i;
  }
  // And the weights did move: a no-op update could not pass as agreement.
  State start(n, 11);
  double shift = 0;
  for (int64_t i = 0; i < n; ++i) shift = std::max(shift, std::abs(double(start.master[i]) - w[i]));
  EXPECT_GT(shift, 1e-4);
}

TEST(HostThreadPoolTest, CoversEachIndexOnce) {
  HostThreadPool pool(5);
  EXPECT_EQ(pool.size(), 5);
  for (int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{1000}, int64_t{100001}}) {
    std::vector<std::atomic<int>> hits(n);
    for (auto& h : hits) h = 0;
    for (int rep = 0; rep < 3; ++rep) {
      pool.ParallelFor(n, 32, [&](int64_t b, int64_t e) {
        EXPECT_TRUE(b % 32 == 0) << b;
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
    }
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 3) << "n " << n << " i " << i;
  }
}

}  // namespace
}  // namespace ithaca
