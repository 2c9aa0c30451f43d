// Every CudaOps op against the CPU oracle (CpuOps, f32) within bf16 tolerances, on shapes that
// are not multiples of any tile size. Inputs are rounded to bf16 first, so both backends see the
// same numbers and the error is the GPU's arithmetic plus its bf16 output rounding.
#include "engine/backend/cuda/cuda_ops.h"
#include "engine/backend/cuda/gemm.h"

#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "engine/backend/cpu/cpu_ops.h"
#include "engine/backend/cuda/cuda_allocator.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/cuda/cuda_test_util.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using cuda_test::CpuT;
using cuda_test::Dev;
using cuda_test::Host;
using cuda_test::Poisoned;
using cuda_test::Randn;

constexpr double kBf16Tol = 1e-2;  // bf16 outputs: rounding is 2^-9 relative, sums add a little

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    alloc_ = std::make_unique<CudaAllocator>();
    CudaOps::Options o;
    o.alloc = alloc_.get();
    ops_ = std::make_unique<CudaOps>(o);
  }
  Buffer D(DType t, Shape s, const std::vector<float>& v) {
    return Dev(*ops_, alloc_.get(), t, std::move(s), v);
  }
  Buffer P(DType t, Shape s) { return Poisoned(*ops_, alloc_.get(), t, std::move(s)); }
  std::vector<float> H(const Buffer& b) { return Host(*ops_, b.tensor()); }

  std::unique_ptr<CudaAllocator> alloc_;
  std::unique_ptr<CudaOps> ops_;
  CpuOps cpu_;
};

// A memory budget too small for CudaOps' own workspaces (the 32 MiB GEMM workspace here) is a
// clear error from the backend, naming what did not fit, not an abort of the worker.
TEST(CudaBackendTest, ABudgetTooSmallForTheWorkspacesIsAnErrorNotAnAbort) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions o;
  o.budget_bytes = size_t{1} << 20;
  absl::StatusOr<CudaBackend> b = MakeCudaBackend(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  EXPECT_NE(b.status().message().find("GEMM workspace"), std::string::npos) << b.status();
  // With room for them the same options make a backend that works.
  o.budget_bytes = size_t{64} << 20;
  absl::StatusOr<CudaBackend> ok = MakeCudaBackend(o);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->ops->status().ok());
}

TEST_F(CudaOpsTest, FillCopyUploadDownload) {
  auto x = P(DType::kBF16, {7, 13});
  ops_->Fill(x.tensor(), 1.5f);
  for (float v : H(x)) ASSERT_EQ(v, 1.5f);
  std::vector<float> src = Randn(91, 1, 1.f, /*bf16=*/false);
  auto f = D(DType::kF32, {91}, src);
  auto b = P(DType::kBF16, {91});
  ops_->Copy(f.tensor(), b.tensor());
  auto back = P(DType::kF32, {91});
  ops_->Copy(b.tensor(), back.tensor());
  const std::vector<float> got = H(back);
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(got[i], cuda_test::RoundBf16(src[i])) << i;
  // i32 round trip, and a strided 2-D copy (5 rows of 3 out of rows of 7 into rows of 4).
  std::vector<int32_t> ids = {3, -1, 7, 1 << 20};
  auto di = Buffer::Make(alloc_.get(), DType::kI32, {4}, Tier::kActivations);
  ASSERT_TRUE(di.ok());
  ops_->Upload(ids.data(), DType::kI32, di->tensor());
  std::vector<int32_t> ids_back(4);
  ops_->Download(di->tensor(), ids_back.data(), DType::kI32);
  EXPECT_EQ(ids, ids_back);
  std::vector<float> s2(35);
  std::iota(s2.begin(), s2.end(), 0.f);
  auto src2 = D(DType::kF32, {35}, s2);
  auto dst2 = D(DType::kF32, {20}, std::vector<float>(20, -1.f));
  ops_->Copy2D(src2.tensor(), 7, dst2.tensor(), 4, 5, 3);
  const std::vector<float> g2 = H(dst2);
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 4; ++c) EXPECT_EQ(g2[r * 4 + c], c < 3 ? s2[r * 7 + c] : -1.f);
  }
}

// Views one element into their buffers: Fill, Copy (both conversions), Axpy and the
// reductions take their scalar loops (the aligned tests above take the vector ones).
TEST_F(CudaOpsTest, ElementwiseOnUnalignedViews) {
  const int64_t n = 1003;
  std::vector<float> src = Randn(n + 1, 21, 1.f, /*bf16=*/false);
  auto f = D(DType::kF32, {n + 1}, src);
  auto b = P(DType::kBF16, {n + 1});
  auto back = P(DType::kF32, {n + 1});
  const Tensor fv = f.tensor().Slice(1, {n}), bv = b.tensor().Slice(1, {n});
  const Tensor backv = back.tensor().Slice(1, {n});
  ops_->Copy(fv, bv);
  ops_->Copy(bv, backv);
  std::vector<float> got = H(back);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i + 1], cuda_test::RoundBf16(src[i + 1])) << i;
  ops_->Axpy(2.f, bv, backv);  // back = 3 · round(src), exact in f32
  got = H(back);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i + 1], 3.f * cuda_test::RoundBf16(src[i + 1])) << i;
    sum += got[i + 1];
  }
  EXPECT_NEAR(ops_->Sum(backv), sum, 1e-9 * n);
  ops_->Fill(bv, -2.f);
  got = H(b);
  EXPECT_TRUE(std::isnan(got[0])) << "Fill wrote before its view";
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i + 1], -2.f) << i;
}

TEST_F(CudaOpsTest, AxpySumAndSumSquares) {
  const int64_t n = 100003;
  std::vector<float> x = Randn(n, 2), y = Randn(n, 3, 1.f, false);
  auto dx = D(DType::kBF16, {n}, x);
  auto dy = D(DType::kF32, {n}, y);
  ops_->Axpy(-0.75f, dx.tensor(), dy.tensor());
  std::vector<float> want = y;
  cpu_.Axpy(-0.75f, CpuT(x, {n}), CpuT(want, {n}));
  EXPECT_CLOSE(H(dy), want, 1e-6, "Axpy");
  const double ss = ops_->SumSquares(dx.tensor()), s = ops_->Sum(dx.tensor());
  const double ss_ref = cpu_.SumSquares(CpuT(x, {n})), s_ref = cpu_.Sum(CpuT(x, {n}));
  std::printf("  SumSquares %.6f vs %.6f, Sum %.6f vs %.6f\n", ss, ss_ref, s, s_ref);
  EXPECT_NEAR(ss, ss_ref, 1e-9 * ss_ref);
  EXPECT_NEAR(s, s_ref, 1e-9 * ss_ref);
  EXPECT_NEAR(ops_->Sum(dy.tensor()), cpu_.Sum(CpuT(want, {n})), 1e-6 * ss_ref);
}

// SumInto / SumSquaresInto finish the reduction on the device: the same double sums as Sum and
// SumSquares, rounded once to f32, into one element of a buffer (the others untouched); back to
// back, since they share the partials scratch in stream order.
TEST_F(CudaOpsTest, SumsIntoADeviceScalar) {
  const int64_t n = 100003;
  std::vector<float> x = Randn(n, 4);
  auto dx = D(DType::kBF16, {n}, x);
  auto dy = D(DType::kF32, {n}, x);
  auto out = D(DType::kF32, {4}, {-1.f, -1.f, -1.f, -1.f});
  ops_->SumSquaresInto(dx.tensor(), out.tensor().Slice(0, {1}));
  ops_->SumInto(dx.tensor(), out.tensor().Slice(1, {1}));
  ops_->SumInto(dy.tensor().Slice(0, {0}), out.tensor().Slice(3, {1}));
  const std::vector<float> got = H(out);
  // The partials are added in another order than Sum's host loop: equal up to f32 rounding.
  EXPECT_FLOAT_EQ(got[0], static_cast<float>(ops_->SumSquares(dx.tensor())));
  EXPECT_FLOAT_EQ(got[1], static_cast<float>(ops_->Sum(dx.tensor())));
  EXPECT_EQ(got[2], -1.f);
  EXPECT_EQ(got[3], 0.f);
  EXPECT_NEAR(got[0], cpu_.SumSquares(CpuT(x, {n})), 1e-6 * got[0]);
}

// All four transpose combinations, C bf16 (beta 0) and C f32 (beta 1, as gradients accumulate),
// on a shape no kernel tile divides and on one with 16-byte-aligned rows.
TEST_F(CudaOpsTest, GemmAllLayoutsAgainstCpu) {
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{37, 53, 71}, {200, 136, 264}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (int cf32 = 0; cf32 < 2; ++cf32) {
          std::vector<float> a = Randn(m * k, 10 + ta), b = Randn(k * n, 20 + tb);
          std::vector<float> c0 = Randn(m * n, 30);
          const Shape sa = ta ? Shape{k, m} : Shape{m, k}, sb = tb ? Shape{n, k} : Shape{k, n};
          auto da = D(DType::kBF16, sa, a), db = D(DType::kBF16, sb, b);
          auto dc = D(cf32 ? DType::kF32 : DType::kBF16, {m, n}, c0);
          const float beta = cf32 ? 1.f : 0.f;
          ops_->Gemm(da.tensor(), ta, db.tensor(), tb, dc.tensor(), 0.5f, beta);
          std::vector<float> want = c0;
          cpu_.Gemm(CpuT(a, sa), ta, CpuT(b, sb), tb, CpuT(want, {m, n}), 0.5f, beta);
          const std::string what = absl::StrCat("Gemm ", m, "x", n, "x", k, ta ? " aT" : "",
                                                tb ? " bT" : "", cf32 ? " c f32 +=" : " c bf16");
          EXPECT_CLOSE(H(dc), want, cf32 ? 1e-5 : kBf16Tol, what.c_str());
        }
      }
    }
  }
}

// The timed choice (LtGemm's kGemmTimed, the default): a shape's first calls each run one of
// cuBLASLt's candidates, timed, and then the fastest. Every call must still be exactly one product:
// each overwrite (c bf16, beta 0) equals the CPU's, and the accumulations (c f32, beta 1) over
// all the calls sum each product once.
TEST_F(CudaOpsTest, GemmTimedChoiceRunsEachCallOnce) {
  const int calls = cuda::LtGemm::kTimedCandidates * cuda::LtGemm::kTimedCallsEach + 3;
  const int64_t m = 512, n = 384, k = 640;
  std::vector<float> a = Randn(m * k, 50), b = Randn(n * k, 51), c0 = Randn(m * n, 52);
  auto da = D(DType::kBF16, {m, k}, a), db = D(DType::kBF16, {n, k}, b);
  std::vector<float> product(m * n, 0.f);
  cpu_.Gemm(CpuT(a, {m, k}), false, CpuT(b, {n, k}), true, CpuT(product, {m, n}), 1.f, 0.f);
  auto dc = P(DType::kBF16, {m, n});
  for (int i = 0; i < calls; ++i) {
    ops_->Gemm(da.tensor(), false, db.tensor(), true, dc.tensor(), 1.f, 0.f);
    EXPECT_CLOSE(H(dc), product, kBf16Tol, absl::StrCat("c bf16, call ", i + 1).c_str());
  }
  auto acc = D(DType::kF32, {m, n}, c0);
  for (int i = 0; i < calls; ++i) {
    ops_->Gemm(da.tensor(), false, db.tensor(), true, acc.tensor(), 0.5f, 1.f);
  }
  std::vector<float> want = c0;
  for (size_t i = 0; i < want.size(); ++i) want[i] += 0.5f * calls * product[i];
  EXPECT_CLOSE(H(acc), want, 1e-5, "c f32 += over the timed calls");
}

// GemmBias (cuBLASLt's bias epilogue, or the fallback's kernel) against the CPU's: every
// transpose on an odd shape and an aligned one, and the projection's own case (h · Wᵀ into a
// slot, the bias a slice of a longer one, alpha the rope scale), with beta 0 and 1.
TEST_F(CudaOpsTest, GemmBiasAgainstCpu) {
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    int64_t bias_at;  // the bias is elements [bias_at, bias_at + n) of a longer vector
  };
  std::vector<Case> cases = {{512, 256, 1024, false, true, 768}, {37, 53, 71, false, true, 3}};
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) cases.push_back({200, 136, 264, bool(ta), bool(tb), 0});
  }
  for (const Case& cs : cases) {
    for (float beta : {0.f, 1.f}) {
      const int64_t m = cs.m, n = cs.n, k = cs.k;
      std::vector<float> a = Randn(m * k, 40), b = Randn(k * n, 41), c0 = Randn(m * n, 42);
      std::vector<float> bias = Randn(cs.bias_at + n + 5, 43);
      const Shape sa = cs.ta ? Shape{k, m} : Shape{m, k}, sb = cs.tb ? Shape{n, k} : Shape{k, n};
      auto da = D(DType::kBF16, sa, a), db = D(DType::kBF16, sb, b);
      auto dbias = D(DType::kBF16, {int64_t(bias.size())}, bias);
      auto dc = D(DType::kBF16, {m, n}, c0);
      const float alpha = 0.75f;
      ops_->GemmBias(da.tensor(), cs.ta, db.tensor(), cs.tb, dbias.tensor().Slice(cs.bias_at, {n}),
                     dc.tensor(), alpha, beta);
      std::vector<float> want = c0;
      std::vector<float> bias_n(bias.begin() + cs.bias_at, bias.begin() + cs.bias_at + n);
      cpu_.GemmBias(CpuT(a, sa), cs.ta, CpuT(b, sb), cs.tb, CpuT(bias_n, {n}), CpuT(want, {m, n}),
                    alpha, beta);
      const std::string what =
          absl::StrCat("GemmBias ", m, "x", n, "x", k, cs.ta ? " aT" : "", cs.tb ? " bT" : "",
                       " bias at ", cs.bias_at, " beta ", beta);
      EXPECT_CLOSE(H(dc), want, kBf16Tol, what.c_str());
    }
  }
}

TEST_F(CudaOpsTest, EmbeddingForwardAndBackward) {
  const int64_t V = 101, d = 67, T = 45;
  std::vector<float> table = Randn(V * d, 4);
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * 37) % 23);  // repeats
  auto dids = Buffer::Make(alloc_.get(), DType::kI32, {T}, Tier::kActivations);
  ASSERT_TRUE(dids.ok());
  ops_->Upload(ids.data(), DType::kI32, dids->tensor());
  auto dtab = D(DType::kBF16, {V, d}, table);
  auto out = P(DType::kBF16, {T, d});
  ops_->Embedding(dids->tensor(), dtab.tensor(), out.tensor());
  std::vector<float> want(T * d);
  Tensor cids(ids.data(), DType::kI32, {T});
  cpu_.Embedding(cids, CpuT(table, {V, d}), CpuT(want, {T, d}));
  EXPECT_CLOSE(H(out), want, 1e-7, "Embedding");

  std::vector<float> dout = Randn(T * d, 5), g0 = Randn(V * d, 6, 1.f, false);
  auto ddout = D(DType::kBF16, {T, d}, dout);
  auto dg = D(DType::kF32, {V, d}, g0);
  ops_->EmbeddingBackward(dids->tensor(), ddout.tensor(), dg.tensor());
  std::vector<float> gwant = g0;
  cpu_.EmbeddingBackward(cids, CpuT(dout, {T, d}), CpuT(gwant, {V, d}));
  EXPECT_CLOSE(H(dg), gwant, 1e-6, "EmbeddingBackward");
}

// The vector path (d % 8 == 0: one team of warps per row; more rows than a wave of backward
// blocks) and the scalar one (d % 8 != 0); dx and dw start nonzero, as both are accumulated.
TEST_F(CudaOpsTest, RmsNormForwardAndBackward) {
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{37, 1000}, {3001, 2048}, {301, 2050}}) {
    const std::string shape = absl::StrCat(" ", rows, "x", d);
    std::vector<float> x = Randn(rows * d, 7), w = Randn(d, 8, 0.1f);
    for (float& v : w) v = cuda_test::RoundBf16(1.f + v);
    auto dx_in = D(DType::kBF16, {rows, d}, x), dw_in = D(DType::kBF16, {d}, w);
    auto out = P(DType::kBF16, {rows, d});
    auto rstd = P(DType::kF32, {rows});
    ops_->RmsNorm(dx_in.tensor(), dw_in.tensor(), 1e-5f, out.tensor(), rstd.tensor());
    std::vector<float> want(rows * d), rwant(rows);
    cpu_.RmsNorm(CpuT(x, {rows, d}), CpuT(w, {d}), 1e-5f, CpuT(want, {rows, d}),
                 CpuT(rwant, {rows}));
    EXPECT_CLOSE(H(out), want, kBf16Tol, ("RmsNorm out" + shape).c_str());
    const std::vector<float> rgot = H(rstd);
    EXPECT_CLOSE(rgot, rwant, 1e-5, ("RmsNorm rstd" + shape).c_str());

    std::vector<float> dout = Randn(rows * d, 9), dx0 = Randn(rows * d, 10);
    std::vector<float> dw0 = Randn(d, 11, 1.f, false);
    auto ddout = D(DType::kBF16, {rows, d}, dout), ddx = D(DType::kBF16, {rows, d}, dx0);
    auto ddw = D(DType::kF32, {d}, dw0);
    ops_->RmsNormBackward(dx_in.tensor(), dw_in.tensor(), rstd.tensor(), ddout.tensor(),
                          ddx.tensor(), ddw.tensor());
    std::vector<float> dxw = dx0, dww = dw0;
    cpu_.RmsNormBackward(CpuT(x, {rows, d}), CpuT(w, {d}), CpuT(rwant, {rows}),
                         CpuT(dout, {rows, d}), CpuT(dxw, {rows, d}), CpuT(dww, {d}));
    EXPECT_CLOSE(H(ddx), dxw, kBf16Tol, ("RmsNormBackward dx (+=)" + shape).c_str());
    EXPECT_CLOSE(H(ddw), dww, 1e-4, ("RmsNormBackward dw (+=)" + shape).c_str());
  }
}

// The per-head q/k norms' ops: RmsNorm with out = x, and RmsNormBackwardInPlace (rstd remade,
// dx written over dout, dw accumulated from nonzero) against the CPU oracle's; head_dim 128 and
// 64 on the vector path (many rows: several per team and block), 12 on the scalar one.
TEST_F(CudaOpsTest, RmsNormInPlaceForwardAndBackward) {
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{6000, 128}, {333, 64}, {301, 12}}) {
    const std::string shape = absl::StrCat(" ", rows, "x", d);
    std::vector<float> x = Randn(rows * d, 50, 3.f), w = Randn(d, 51, 0.2f);
    for (float& v : w) v = cuda_test::RoundBf16(1.f + v);
    auto dx = D(DType::kBF16, {rows, d}, x), dw = D(DType::kBF16, {d}, w);
    auto rstd = P(DType::kF32, {rows});
    auto inplace = D(DType::kBF16, {rows, d}, x);
    ops_->RmsNorm(inplace.tensor(), dw.tensor(), 1e-6f, inplace.tensor(), rstd.tensor());
    std::vector<float> want(rows * d), rwant(rows);
    cpu_.RmsNorm(CpuT(x, {rows, d}), CpuT(w, {d}), 1e-6f, CpuT(want, {rows, d}),
                 CpuT(rwant, {rows}));
    EXPECT_CLOSE(H(inplace), want, kBf16Tol, ("RmsNorm in place" + shape).c_str());
    EXPECT_CLOSE(H(rstd), rwant, 1e-5, ("RmsNorm in place rstd" + shape).c_str());

    std::vector<float> g = Randn(rows * d, 52), dw0 = Randn(d, 53, 1.f, false);
    auto dg = D(DType::kBF16, {rows, d}, g);
    auto ddw = D(DType::kF32, {d}, dw0);
    ops_->RmsNormBackwardInPlace(dx.tensor(), dw.tensor(), 1e-6f, dg.tensor(), ddw.tensor());
    std::vector<float> gwant = g, dwwant = dw0;
    cpu_.RmsNormBackwardInPlace(CpuT(x, {rows, d}), CpuT(w, {d}), 1e-6f, CpuT(gwant, {rows, d}),
                                CpuT(dwwant, {d}));
    EXPECT_CLOSE(H(dg), gwant, kBf16Tol, ("RmsNormBackwardInPlace dx" + shape).c_str());
    EXPECT_CLOSE(H(ddw), dwwant, 1e-4, ("RmsNormBackwardInPlace dw (+=)" + shape).c_str());
  }
}

// D = 64 takes the vector path (D/2 % 8 == 0), D = 12 the scalar one.
TEST_F(CudaOpsTest, RopeForwardAndInverse) {
  for (int64_t Dd : {64, 12}) {
    const int64_t T = 29, Hh = 3, pos0 = 100000;  // far positions test the angle's precision
    RopeConfig rc;
    rc.head_dim = static_cast<int>(Dd);
    rc.type = RopeType::kLlama3;
    const std::vector<float> inv = RopeInverseFrequencies(rc);
    std::vector<float> x = Randn(T * Hh * Dd, 12);
    auto dinv = D(DType::kF32, {Dd / 2}, inv);
    std::vector<float> inv_c = inv;
    for (bool inverse : {false, true}) {
      auto y = D(DType::kBF16, {T, Hh, Dd}, x);
      ops_->Rope(y.tensor(), pos0, dinv.tensor(), inverse, DocumentMask{});
      std::vector<float> want = x;
      cpu_.Rope(CpuT(want, {T, Hh, Dd}), pos0, CpuT(inv_c, {Dd / 2}), inverse, DocumentMask{});
      const std::string what = absl::StrCat(inverse ? "Rope inverse" : "Rope", " D=", Dd);
      EXPECT_CLOSE(H(y), want, kBf16Tol, what.c_str());
    }
  }
}

// A packed sample: positions restart at each document's start, for a view that begins inside a
// document (pos0 > 0) and covers a one-token document; against the CPU oracle. The trivial mask
// {0} is the old path, bit for bit.
TEST_F(CudaOpsTest, RopeWithDocuments) {
  const DocumentMask docs{{0, 37, 38, 90, 91, 200}};
  for (int64_t Dd : {64, 128, 12}) {
    const int64_t T = 150, Hh = 3, pos0 = 20;  // sample indices [20, 170)
    RopeConfig rc;
    rc.head_dim = static_cast<int>(Dd);
    const std::vector<float> inv = RopeInverseFrequencies(rc);
    std::vector<float> x = Randn(T * Hh * Dd, 13);
    auto dinv = D(DType::kF32, {Dd / 2}, inv);
    std::vector<float> inv_c = inv;
    for (bool inverse : {false, true}) {
      auto y = D(DType::kBF16, {T, Hh, Dd}, x);
      ops_->Rope(y.tensor(), pos0, dinv.tensor(), inverse, docs);
      std::vector<float> want = x;
      cpu_.Rope(CpuT(want, {T, Hh, Dd}), pos0, CpuT(inv_c, {Dd / 2}), inverse, docs);
      const std::string what =
          absl::StrCat(inverse ? "Rope inverse" : "Rope", " with documents D=", Dd);
      EXPECT_CLOSE(H(y), want, kBf16Tol, what.c_str());
      // Token 37 - pos0 starts a document: its rotation is the identity (position 0).
      const std::vector<float> got = H(y);
      for (int64_t e = 0; e < Hh * Dd; ++e) {
        const int64_t i = (37 - pos0) * Hh * Dd + e;
        ASSERT_EQ(got[i], x[i]) << what << " element " << e;
      }
      auto a = D(DType::kBF16, {T, Hh, Dd}, x), b = D(DType::kBF16, {T, Hh, Dd}, x);
      ops_->Rope(a.tensor(), pos0, dinv.tensor(), inverse, DocumentMask{});
      ops_->Rope(b.tensor(), pos0, dinv.tensor(), inverse, DocumentMask{{0}});
      EXPECT_EQ(H(a), H(b)) << what << ": the trivial mask";
    }
  }
}

// n = 13·177 is not a multiple of 8: aligned views take the vector path and its scalar tail;
// views one element into their buffers take the scalar path.
TEST_F(CudaOpsTest, SwiGLUForwardAndBackward) {
  const int64_t T = 13, F = 177, n = T * F;
  for (int64_t offset : {0, 1}) {
    const std::string at = offset ? " (unaligned)" : "";
    // Device buffers of offset + n elements; the ops see [T, F] views `offset` elements in.
    auto dev = [&](const std::vector<float>& v) {
      std::vector<float> padded(offset, 0.f);
      padded.insert(padded.end(), v.begin(), v.end());
      return D(DType::kBF16, {offset + n}, padded);
    };
    auto view = [&](const Buffer& b) { return b.tensor().Slice(offset, {T, F}); };
    auto host = [&](const Buffer& b) {
      const std::vector<float> v = H(b);
      return std::vector<float>(v.begin() + offset, v.end());
    };
    std::vector<float> g = Randn(n, 13, 2.f), u = Randn(n, 14), go = Randn(n, 15);
    auto dg = dev(g), du = dev(u);
    auto out = P(DType::kBF16, {offset + n});
    ops_->SwiGLU(view(dg), view(du), view(out));
    std::vector<float> want(n);
    cpu_.SwiGLU(CpuT(g, {T, F}), CpuT(u, {T, F}), CpuT(want, {T, F}));
    EXPECT_CLOSE(host(out), want, kBf16Tol, ("SwiGLU" + at).c_str());
    auto dgo = dev(go);
    // In place, as the model calls it: dgate over gate, dup over up.
    ops_->SwiGLUBackward(view(dg), view(du), view(dgo), view(dg), view(du));
    std::vector<float> dgw(n), duw(n);
    cpu_.SwiGLUBackward(CpuT(g, {T, F}), CpuT(u, {T, F}), CpuT(go, {T, F}), CpuT(dgw, {T, F}),
                        CpuT(duw, {T, F}));
    EXPECT_CLOSE(host(dg), dgw, kBf16Tol, ("SwiGLUBackward dgate" + at).c_str());
    EXPECT_CLOSE(host(du), duw, kBf16Tol, ("SwiGLUBackward dup" + at).c_str());
  }
}

// V = 1001 takes the scalar path; V = 1024 the vector one (bf16 and f32 logits).
TEST_F(CudaOpsTest, CrossEntropyFusedWithGradientIgnoresNegativeLabels) {
  for (auto [V, dt] :
       {std::pair<int64_t, DType>{1001, DType::kBF16}, {1024, DType::kBF16}, {1024, DType::kF32}}) {
    const int64_t T = 19;
    const std::string what = absl::StrCat("CrossEntropy V=", V, " ", DTypeName(dt));
    std::vector<float> logits = Randn(T * V, 16, 3.f);
    std::vector<int32_t> labels(T);
    for (int64_t t = 0; t < T; ++t) {
      labels[t] = t % 5 == 3 ? -1 : static_cast<int32_t>(t * 53 % V);
    }
    auto dl = D(dt, {T, V}, logits);
    auto dlab = Buffer::Make(alloc_.get(), DType::kI32, {T}, Tier::kActivations);
    ASSERT_TRUE(dlab.ok());
    ops_->Upload(labels.data(), DType::kI32, dlab->tensor());
    auto losses = P(DType::kF32, {T});
    // dlogits aliases logits, as in the model's loss tiles.
    ops_->CrossEntropy(dl.tensor(), dlab->tensor(), losses.tensor(), dl.tensor(), 1.f / 7);
    std::vector<float> lw(T), gw(T * V);
    Tensor clab(labels.data(), DType::kI32, {T});
    cpu_.CrossEntropy(CpuT(logits, {T, V}), clab, CpuT(lw, {T}), CpuT(gw, {T, V}), 1.f / 7);
    EXPECT_CLOSE(H(losses), lw, 1e-5, (what + " losses").c_str());
    const std::vector<float> got = H(dl);
    EXPECT_CLOSE(got, gw, dt == DType::kF32 ? 1e-5 : kBf16Tol, (what + " dlogits").c_str());
    for (int64_t v = 0; v < V; ++v) ASSERT_EQ(got[3 * V + v], 0.f) << "ignored row 3, " << what;
  }
}

TEST_F(CudaOpsTest, LabelIsArgmaxMatchesTheCpuOracle) {
  for (auto [V, dt] :
       {std::pair<int64_t, DType>{1001, DType::kBF16}, {4096, DType::kBF16}, {1024, DType::kF32}}) {
    const int64_t T = 23;
    const std::string what = absl::StrCat("LabelIsArgmax V=", V, " ", DTypeName(dt));
    // Randn rounds to bf16, so the device and the oracle see the same values in either dtype.
    std::vector<float> logits = Randn(T * V, 21, 3.f);
    std::vector<int32_t> labels(T);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = logits.data() + t * V;
      const int32_t argmax = static_cast<int32_t>(std::max_element(row, row + V) - row);
      // Every third row's label is its argmax; every fifth is ignored; the others are not it.
      labels[t] = t % 5 == 4 ? -1 : t % 3 == 0 ? argmax : (argmax + 1 + t) % V;
    }
    // A tie: row 6's largest logit copied to an earlier column, so the label there misses, and
    // row 9's copied to a later one, so it still hits.
    float* r6 = logits.data() + 6 * V;
    const int64_t a6 = std::max_element(r6, r6 + V) - r6;
    r6[a6 == 0 ? 1 : 0] = r6[a6];
    if (a6 == 0) labels[6] = 1;  // keep the label on the later of the two
    float* r9 = logits.data() + 9 * V;
    const int64_t a9 = std::max_element(r9, r9 + V) - r9;
    r9[a9 == V - 1 ? 0 : V - 1] = r9[a9];
    auto dl = D(dt, {T, V}, logits);
    auto dlab = Buffer::Make(alloc_.get(), DType::kI32, {T}, Tier::kActivations);
    ASSERT_TRUE(dlab.ok());
    ops_->Upload(labels.data(), DType::kI32, dlab->tensor());
    auto hits = P(DType::kF32, {T});
    ops_->LabelIsArgmax(dl.tensor(), dlab->tensor(), hits.tensor());
    std::vector<float> want(T);
    Tensor clab(labels.data(), DType::kI32, {T});
    cpu_.LabelIsArgmax(CpuT(logits, {T, V}), clab, CpuT(want, {T}));
    EXPECT_EQ(H(hits), want) << what;
    EXPECT_GT(std::count(want.begin(), want.end(), 1.f), 3) << what;
    EXPECT_EQ(want[6], 0.f) << what << ": a tie goes to the first column";
  }
}

TEST_F(CudaOpsTest, AdamWWithF32AndBf16Gradients) {
  const int64_t n = 1234;
  AdamWParams p;
  p.lr = 1e-2f;
  p.weight_decay = 0.1f;
  p.grad_scale = 0.5f;
  p.step = 3;
  for (DType gt : {DType::kF32, DType::kBF16}) {
    std::vector<float> w = Randn(n, 17, 1.f, false), g = Randn(n, 18);
    std::vector<float> m = Randn(n, 19, 0.1f, false), v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = std::fabs(Randn(1, 20 + i, 0.01f, false)[0]);
    auto dw = D(DType::kF32, {n}, w), dg = D(gt, {n}, g), dm = D(DType::kF32, {n}, m);
    auto dv = D(DType::kF32, {n}, v);
    auto work = P(DType::kBF16, {n});
    ops_->AdamW(dw.tensor(), dg.tensor(), dm.tensor(), dv.tensor(), work.tensor(), p);
    std::vector<float> wc = w, mc = m, vc = v, workc(n);
    cpu_.AdamW(CpuT(wc, {n}), CpuT(g, {n}), CpuT(mc, {n}), CpuT(vc, {n}), CpuT(workc, {n}), p);
    EXPECT_CLOSE(H(dw), wc, 1e-6, "AdamW master");
    EXPECT_CLOSE(H(dm), mc, 1e-6, "AdamW m");
    EXPECT_CLOSE(H(dv), vc, 1e-6, "AdamW v");
    EXPECT_CLOSE(H(work), wc, kBf16Tol, "AdamW bf16 working copy");
  }
}

}  // namespace
}  // namespace ithaca
