// Tests of CpuOps: every layer in float against the double kernels on the same data (within
// fp32 tolerance), AdamW against a hand-computed two-step reference, dtype conversion on
// Copy/Upload/Download, and the shape checks.
#include "engine/backend/cpu/cpu_ops.h"

#include <omp.h>

#include <cmath>
#include <cstring>

#include "engine/backend/cpu/attention.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/test_util.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using cpu_test::AllNear;
using cpu_test::Random;
using cpu_test::ToDouble;
using cpu_test::ToFloat;

Tensor F32(std::vector<float>& v, Shape s) { return Tensor(v.data(), DType::kF32, std::move(s)); }
Tensor I32(std::vector<int32_t>& v, Shape s) { return Tensor(v.data(), DType::kI32, std::move(s)); }

// The double reference runs on the float-rounded inputs, so only the float arithmetic differs.
std::vector<double> RandomF(int64_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return ToDouble(ToFloat(Random(n, seed, lo, hi)));
}

TEST(CpuOpsTest, DeviceAndDType) {
  CpuOps ops;
  EXPECT_EQ(ops.device(), Device::kCpu);
  EXPECT_EQ(ops.act_dtype(), DType::kF32);
}

TEST(CpuOpsTest, EmbeddingMatchesDouble) {
  CpuOps ops;
  const int64_t vocab = 11, d = 6;
  std::vector<int32_t> ids = {3, 0, 10, 3, 7};
  const int64_t tokens = ids.size();
  const std::vector<double> table = RandomF(vocab * d, 1), g = RandomF(tokens * d, 2);
  std::vector<float> tf = ToFloat(table), gf = ToFloat(g), out(tokens * d), dtf(vocab * d, 0.5f);
  ops.Embedding(I32(ids, {tokens}), F32(tf, {vocab, d}), F32(out, {tokens, d}));
  ops.EmbeddingBackward(I32(ids, {tokens}), F32(gf, {tokens, d}), F32(dtf, {vocab, d}));
  std::vector<double> want(tokens * d), dt(vocab * d, 0.5);
  cpu::Embedding(ids.data(), tokens, table.data(), vocab, d, want.data());
  cpu::EmbeddingBackward(ids.data(), tokens, g.data(), vocab, d, dt.data());
  EXPECT_TRUE(AllNear(out, want, 0.0));
  EXPECT_TRUE(AllNear(dtf, dt, 1e-6));
}

TEST(CpuOpsTest, RmsNormMatchesDouble) {
  CpuOps ops;
  const int64_t tokens = 5, d = 300;
  const std::vector<double> x = RandomF(tokens * d, 3), w = RandomF(d, 4),
                            g = RandomF(tokens * d, 5);
  std::vector<float> xf = ToFloat(x), wf = ToFloat(w), gf = ToFloat(g);
  std::vector<float> out(tokens * d), rstd(tokens), dx(tokens * d, 1.0f), dw(d, -1.0f);
  ops.RmsNorm(F32(xf, {tokens, d}), F32(wf, {d}), 1e-5f, F32(out, {tokens, d}),
              F32(rstd, {tokens}));
  ops.RmsNormBackward(F32(xf, {tokens, d}), F32(wf, {d}), F32(rstd, {tokens}), F32(gf, {tokens, d}),
                      F32(dx, {tokens, d}), F32(dw, {d}));
  std::vector<double> o(tokens * d), r(tokens), ddx(tokens * d, 1.0), ddw(d, -1.0);
  cpu::RmsNorm(x.data(), w.data(), tokens, d, 1e-5, o.data(), r.data());
  cpu::RmsNormBackward(x.data(), w.data(), r.data(), g.data(), tokens, d, ddx.data(), ddw.data());
  EXPECT_TRUE(AllNear(out, o, 1e-5, 1e-5));
  EXPECT_TRUE(AllNear(rstd, r, 0.0, 1e-6));
  EXPECT_TRUE(AllNear(dx, ddx, 1e-5, 1e-5));
  EXPECT_TRUE(AllNear(dw, ddw, 1e-5, 1e-5));
}

// In place (out = x), as the per-head q/k norms run: the same values as out of place.
TEST(CpuOpsTest, RmsNormInPlaceMatchesOutOfPlace) {
  CpuOps ops;
  const int64_t rows = 6, d = 16;
  std::vector<float> x = ToFloat(Random(rows * d, 21)), w = ToFloat(Random(d, 22));
  std::vector<float> out(rows * d), rstd(rows), rstd2(rows);
  ops.RmsNorm(F32(x, {rows, d}), F32(w, {d}), 1e-6f, F32(out, {rows, d}), F32(rstd, {rows}));
  ops.RmsNorm(F32(x, {rows, d}), F32(w, {d}), 1e-6f, F32(x, {rows, d}), F32(rstd2, {rows}));
  EXPECT_TRUE(AllNear(x, ToDouble(out), 0.0));
  EXPECT_TRUE(AllNear(rstd2, ToDouble(rstd), 0.0));
}

// The in-place backward: rstd remade from x, dx written over dout, dw accumulated; against the
// double kernels with rstd from the double forward and dx from zero.
TEST(CpuOpsTest, RmsNormBackwardInPlaceMatchesDouble) {
  CpuOps ops;
  const int64_t rows = 7, d = 32;
  const std::vector<double> x = RandomF(rows * d, 23), w = RandomF(d, 24),
                            g = RandomF(rows * d, 25);
  std::vector<float> xf = ToFloat(x), wf = ToFloat(w), grad = ToFloat(g), dw(d, 0.25f);
  ops.RmsNormBackwardInPlace(F32(xf, {rows, d}), F32(wf, {d}), 1e-6f, F32(grad, {rows, d}),
                             F32(dw, {d}));
  std::vector<double> o(rows * d), r(rows), ddx(rows * d, 0.0), ddw(d, 0.25);
  cpu::RmsNorm(x.data(), w.data(), rows, d, 1e-6, o.data(), r.data());
  cpu::RmsNormBackward(x.data(), w.data(), r.data(), g.data(), rows, d, ddx.data(), ddw.data());
  EXPECT_TRUE(AllNear(grad, ddx, 1e-5, 1e-5));
  EXPECT_TRUE(AllNear(dw, ddw, 1e-5, 1e-5));
}

// GemmBias = Gemm, then the bias (unscaled by alpha) on every row; both transposes.
TEST(CpuOpsTest, GemmBiasAddsTheBiasAfterAlphaAndBeta) {
  CpuOps ops;
  const int64_t m = 5, n = 6, k = 4;
  const float alpha = 0.5f, beta = 2.f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::vector<double> a = RandomF(m * k, 31), b = RandomF(k * n, 32),
                                bias = RandomF(n, 33), c0 = RandomF(m * n, 34);
      std::vector<float> af = ToFloat(a), bf = ToFloat(b), biasf = ToFloat(bias), c = ToFloat(c0);
      ops.GemmBias(F32(af, ta ? Shape{k, m} : Shape{m, k}), ta,
                   F32(bf, tb ? Shape{n, k} : Shape{k, n}), tb, F32(biasf, {n}), F32(c, {m, n}),
                   alpha, beta);
      std::vector<double> want(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0;
          for (int64_t l = 0; l < k; ++l) {
            dot += (ta ? a[l * m + i] : a[i * k + l]) * (tb ? b[j * k + l] : b[l * n + j]);
          }
          want[i * n + j] = alpha * dot + beta * c0[i * n + j] + bias[j];
        }
      }
      EXPECT_TRUE(AllNear(c, want, 1e-5, 1e-5)) << "trans_a " << ta << " trans_b " << tb;
    }
  }
}

TEST(CpuOpsTest, RopeMatchesDoubleWithLlama3Frequencies) {
  CpuOps ops;
  RopeConfig cfg;
  cfg.head_dim = 16;
  cfg.type = RopeType::kLlama3;
  std::vector<float> inv = RopeInverseFrequencies(cfg);
  const int64_t tokens = 6, heads = 3, d = 16, pos0 = 4093;
  const std::vector<double> x = RandomF(tokens * heads * d, 6);
  for (bool inverse : {false, true}) {
    std::vector<float> xf = ToFloat(x);
    ops.Rope(F32(xf, {tokens, heads, d}), pos0, F32(inv, {d / 2}), inverse, {});
    std::vector<double> want = x;
    cpu::Rope(want.data(), tokens, heads, d, pos0, inv.data(), inverse);
    // The float angle pos·f is rounded (as in Hugging Face): ~pos · 2^-24 ≈ 3e-4 rad here.
    EXPECT_TRUE(AllNear(xf, want, 1e-3)) << "inverse " << inverse;
  }
}

TEST(CpuOpsTest, AttentionMatchesDouble) {
  const int64_t s = 45, hq = 4, hkv = 2, d = 16;
  const std::vector<double> q = RandomF(s * hq * d, 7, -2, 2), k = RandomF(s * hkv * d, 8, -2, 2);
  const std::vector<double> v = RandomF(s * hkv * d, 9), go = RandomF(s * hq * d, 10);
  std::vector<double> o(q.size()), l(hq * s), dq(q.size()), dk(k.size()), dv(v.size());
  cpu::AttentionForward(q.data(), k.data(), v.data(), s, hq, hkv, d, o.data(), l.data());
  cpu::AttentionBackward(q.data(), k.data(), v.data(), o.data(), go.data(), l.data(), s, hq, hkv, d,
                         dq.data(), dk.data(), dv.data());
  // Default blocks and small ones (several ragged blocks) must both agree with the reference.
  for (const cpu::AttentionBlocks b : {cpu::AttentionBlocks{}, cpu::AttentionBlocks{8, 16}}) {
    CpuOps ops(b);
    std::vector<float> qf = ToFloat(q), kf = ToFloat(k), vf = ToFloat(v), gf = ToFloat(go);
    std::vector<float> of(q.size()), lf(hq * s), dqf(q.size()), dkf(k.size()), dvf(v.size());
    ops.Attention(F32(qf, {s, hq, d}), F32(kf, {s, hkv, d}), F32(vf, {s, hkv, d}),
                  F32(of, {s, hq, d}), F32(lf, {hq, s}), {});
    ops.AttentionBackward(F32(qf, {s, hq, d}), F32(kf, {s, hkv, d}), F32(vf, {s, hkv, d}),
                          F32(of, {s, hq, d}), F32(gf, {s, hq, d}), F32(lf, {hq, s}),
                          F32(dqf, {s, hq, d}), F32(dkf, {s, hkv, d}), F32(dvf, {s, hkv, d}), {});
    EXPECT_TRUE(AllNear(of, o, 1e-5, 1e-5));
    EXPECT_TRUE(AllNear(lf, l, 1e-5, 1e-5));
    EXPECT_TRUE(AllNear(dqf, dq, 1e-5, 1e-4));
    EXPECT_TRUE(AllNear(dkf, dk, 1e-5, 1e-4));
    EXPECT_TRUE(AllNear(dvf, dv, 1e-5, 1e-4));
  }
}

// Ring attention's oracle: the whole sample's attention computed as chunks of queries against
// chunks of keys (uneven, at odd positions), the chunks' (out, lse) merged, and their gradients
// (given the merged rows) summed, equals Attention and AttentionBackward over the sample: causal,
// with documents (one crossing every chunk boundary), with a window, and both.
TEST(CpuOpsTest, ChunksMergedEqualTheWholeAttention) {
  const int64_t s = 45, hq = 4, hkv = 2, d = 16;
  const std::vector<int64_t> cuts = {0, 7, 20, 21, 45};  // chunk c is [cuts[c], cuts[c + 1])
  const std::vector<float> q = ToFloat(RandomF(s * hq * d, 7, -2, 2));
  const std::vector<float> k = ToFloat(RandomF(s * hkv * d, 8, -2, 2));
  const std::vector<float> v = ToFloat(RandomF(s * hkv * d, 9)),
                           go = ToFloat(RandomF(s * hq * d, 10));
  auto rows = [&](const std::vector<float>& x, int64_t h, int64_t a, int64_t b) {
    return std::vector<float>(x.begin() + a * h * d, x.begin() + b * h * d);
  };
  for (const DocumentMask& docs : {DocumentMask{}, DocumentMask{{0, 5, 19, 30}},
                                   DocumentMask{{}, 9}, DocumentMask{{0, 5, 19, 30}, 6}}) {
    SCOPED_TRACE(::testing::Message()
                 << docs.starts.size() << " documents, window " << docs.window);
    CpuOps ops(cpu::AttentionBlocks{8, 4});
    std::vector<float> qf = q, kf = k, vf = v, gf = go;
    std::vector<float> o(q.size()), l(hq * s), dq(q.size()), dk(k.size()), dv(v.size());
    ops.Attention(F32(qf, {s, hq, d}), F32(kf, {s, hkv, d}), F32(vf, {s, hkv, d}),
                  F32(o, {s, hq, d}), F32(l, {hq, s}), docs);
    ops.AttentionBackward(F32(qf, {s, hq, d}), F32(kf, {s, hkv, d}), F32(vf, {s, hkv, d}),
                          F32(o, {s, hq, d}), F32(gf, {s, hq, d}), F32(l, {hq, s}),
                          F32(dq, {s, hq, d}), F32(dk, {s, hkv, d}), F32(dv, {s, hkv, d}), docs);
    std::vector<float> got_dk(k.size(), 0.f), got_dv(v.size(), 0.f);
    for (size_t a = 0; a + 1 < cuts.size(); ++a) {
      const int64_t qa = cuts[a], nq = cuts[a + 1] - qa;
      std::vector<float> qc = rows(q, hq, qa, qa + nq), gc = rows(go, hq, qa, qa + nq);
      std::vector<float> acc(qc.size(), 0.f), acc_lse(hq * nq, -INFINITY);
      for (size_t b = 0; b + 1 < cuts.size(); ++b) {  // every key chunk, the invisible ones too
        const int64_t ka = cuts[b], nk = cuts[b + 1] - ka;
        std::vector<float> kc = rows(k, hkv, ka, ka + nk), vc = rows(v, hkv, ka, ka + nk);
        std::vector<float> oc(qc.size()), lc(hq * nq);
        ops.AttentionChunk(F32(qc, {nq, hq, d}), F32(kc, {nk, hkv, d}), F32(vc, {nk, hkv, d}),
                           F32(oc, {nq, hq, d}), F32(lc, {hq, nq}), docs, qa, ka);
        ops.AttentionMerge(F32(acc, {nq, hq, d}), F32(acc_lse, {hq, nq}), F32(oc, {nq, hq, d}),
                           F32(lc, {hq, nq}));
      }
      EXPECT_TRUE(AllNear(acc, ToDouble(rows(o, hq, qa, qa + nq)), 1e-5, 1e-5)) << "chunk " << a;
      std::vector<float> want_l(hq * nq);
      for (int64_t h = 0; h < hq; ++h) {
        std::copy(l.begin() + h * s + qa, l.begin() + h * s + qa + nq, want_l.begin() + h * nq);
      }
      EXPECT_TRUE(AllNear(acc_lse, ToDouble(want_l), 1e-5, 1e-5)) << "chunk " << a;
      // The backward of each (query chunk, key chunk) pair, given the merged rows.
      std::vector<float> dq_sum(qc.size(), 0.f);
      for (size_t b = 0; b + 1 < cuts.size(); ++b) {
        const int64_t ka = cuts[b], nk = cuts[b + 1] - ka;
        std::vector<float> kc = rows(k, hkv, ka, ka + nk), vc = rows(v, hkv, ka, ka + nk);
        std::vector<float> dqc(qc.size()), dkc(kc.size()), dvc(vc.size());
        ops.AttentionChunkBackward(
            F32(qc, {nq, hq, d}), F32(kc, {nk, hkv, d}), F32(vc, {nk, hkv, d}),
            F32(acc, {nq, hq, d}), F32(gc, {nq, hq, d}), F32(acc_lse, {hq, nq}),
            F32(dqc, {nq, hq, d}), F32(dkc, {nk, hkv, d}), F32(dvc, {nk, hkv, d}), docs, qa, ka);
        for (size_t i = 0; i < dqc.size(); ++i) dq_sum[i] += dqc[i];
        for (size_t i = 0; i < dkc.size(); ++i) got_dk[ka * hkv * d + i] += dkc[i];
        for (size_t i = 0; i < dvc.size(); ++i) got_dv[ka * hkv * d + i] += dvc[i];
      }
      EXPECT_TRUE(AllNear(dq_sum, ToDouble(rows(dq, hq, qa, qa + nq)), 1e-5, 1e-4))
          << "chunk " << a;
    }
    EXPECT_TRUE(AllNear(got_dk, ToDouble(dk), 1e-5, 1e-4));
    EXPECT_TRUE(AllNear(got_dv, ToDouble(dv), 1e-5, 1e-4));
  }
}

// A key chunk wholly after the queries (or outside their documents) leaves them out 0, lse −inf.
TEST(CpuOpsTest, AChunkNoQuerySeesIsZeroWithMinusInfinityLse) {
  const int64_t n = 8, hq = 2, hkv = 1, d = 4;
  std::vector<float> q = ToFloat(RandomF(n * hq * d, 1)), k = ToFloat(RandomF(n * hkv * d, 2));
  std::vector<float> v = ToFloat(RandomF(n * hkv * d, 3)), o(q.size(), 5.f), l(hq * n, 5.f);
  CpuOps ops;
  ops.AttentionChunk(F32(q, {n, hq, d}), F32(k, {n, hkv, d}), F32(v, {n, hkv, d}),
                     F32(o, {n, hq, d}), F32(l, {hq, n}), {}, /*q_pos0=*/0, /*k_pos0=*/8);
  for (float x : o) EXPECT_EQ(x, 0.f);
  for (float x : l) EXPECT_EQ(x, -INFINITY);
  ops.AttentionChunk(F32(q, {n, hq, d}), F32(k, {n, hkv, d}), F32(v, {n, hkv, d}),
                     F32(o, {n, hq, d}), F32(l, {hq, n}), DocumentMask{{0, 16}}, 16, 8);
  for (float x : l) EXPECT_EQ(x, -INFINITY);
}

// The exact oracle of document masking: packed attention equals each document's own causal
// attention (its rows of q, k, v cut out), forward and backward, and a packed RoPE equals each
// document's RoPE from position 0. Documents of 1, 7, 22 and 15 tokens cross the small blocks.
TEST(CpuOpsTest, DocumentMaskEqualsSeparateDocuments) {
  const int64_t s = 45, hq = 4, hkv = 2, d = 16;
  const DocumentMask docs{{0, 1, 8, 30}};
  const std::vector<double> q = RandomF(s * hq * d, 7, -2, 2), k = RandomF(s * hkv * d, 8, -2, 2);
  const std::vector<double> v = RandomF(s * hkv * d, 9), go = RandomF(s * hq * d, 10);
  // Rows [a, b) of a [s, h, d] array.
  auto rows = [&](const std::vector<double>& x, int64_t h, int64_t a, int64_t b) {
    return std::vector<double>(x.begin() + a * h * d, x.begin() + b * h * d);
  };
  std::vector<double> o(q.size()), l(hq * s), dq(q.size()), dk(k.size()), dv(v.size());
  for (size_t i = 0; i < docs.starts.size(); ++i) {
    const int64_t a = docs.starts[i], b = i + 1 < docs.starts.size() ? docs.starts[i + 1] : s;
    const int64_t n = b - a;
    std::vector<double> qi = rows(q, hq, a, b), ki = rows(k, hkv, a, b), vi = rows(v, hkv, a, b);
    std::vector<double> gi = rows(go, hq, a, b), oi(qi.size()), li(hq * n);
    std::vector<double> dqi(qi.size()), dki(ki.size()), dvi(vi.size());
    cpu::AttentionForward(qi.data(), ki.data(), vi.data(), n, hq, hkv, d, oi.data(), li.data());
    cpu::AttentionBackward(qi.data(), ki.data(), vi.data(), oi.data(), gi.data(), li.data(), n, hq,
                           hkv, d, dqi.data(), dki.data(), dvi.data());
    std::copy(oi.begin(), oi.end(), o.begin() + a * hq * d);
    std::copy(dqi.begin(), dqi.end(), dq.begin() + a * hq * d);
    std::copy(dki.begin(), dki.end(), dk.begin() + a * hkv * d);
    std::copy(dvi.begin(), dvi.end(), dv.begin() + a * hkv * d);
    for (int64_t h = 0; h < hq; ++h) {
      std::copy(li.begin() + h * n, li.begin() + (h + 1) * n, l.begin() + h * s + a);
    }
  }
  for (const cpu::AttentionBlocks b :
       {cpu::AttentionBlocks{}, cpu::AttentionBlocks{8, 16}, cpu::AttentionBlocks{16, 4}}) {
    CpuOps ops(b);
    std::vector<float> qf = ToFloat(q), kf = ToFloat(k), vf = ToFloat(v), gf = ToFloat(go);
    std::vector<float> of(q.size()), lf(hq * s), dqf(q.size()), dkf(k.size()), dvf(v.size());
    ops.Attention(F32(qf, {s, hq, d}), F32(kf, {s, hkv, d}), F32(vf, {s, hkv, d}),
                  F32(of, {s, hq, d}), F32(lf, {hq, s}), docs);
    ops.AttentionBackward(F32(qf, {s, hq, d}), F32(kf, {s, hkv, d}), F32(vf, {s, hkv, d}),
                          F32(of, {s, hq, d}), F32(gf, {s, hq, d}), F32(lf, {hq, s}),
                          F32(dqf, {s, hq, d}), F32(dkf, {s, hkv, d}), F32(dvf, {s, hkv, d}), docs);
    EXPECT_TRUE(AllNear(of, o, 1e-5, 1e-5)) << "blocks " << b.q << "x" << b.k;
    EXPECT_TRUE(AllNear(lf, l, 1e-5, 1e-5));
    EXPECT_TRUE(AllNear(dqf, dq, 1e-5, 1e-4));
    EXPECT_TRUE(AllNear(dkf, dk, 1e-5, 1e-4));
    EXPECT_TRUE(AllNear(dvf, dv, 1e-5, 1e-4));
  }

  // RoPE of tokens [20, 45) (a rank's share starting inside document 2): the tokens of each
  // document rotate as if that document started at position 0.
  RopeConfig rc;
  rc.head_dim = static_cast<int>(d);
  std::vector<float> inv = RopeInverseFrequencies(rc);
  const int64_t pos0 = 20, t = s - pos0;
  std::vector<float> x = ToFloat(rows(q, hq, pos0, s)), want = x;
  CpuOps ops;
  ops.Rope(F32(x, {t, hq, d}), pos0, F32(inv, {d / 2}), false, docs);
  ops.Rope(F32(want, {10, hq, d}), pos0 - 8, F32(inv, {d / 2}), false, {});
  std::vector<float> rest(want.begin() + 10 * hq * d, want.end());
  ops.Rope(F32(rest, {15, hq, d}), 0, F32(inv, {d / 2}), false, {});
  std::copy(rest.begin(), rest.end(), want.begin() + 10 * hq * d);
  EXPECT_TRUE(AllNear(x, ToDouble(want), 0.0));
}

TEST(CpuOpsTest, SwiGLUMatchesDouble) {
  CpuOps ops;
  const int64_t tokens = 3, f = 50;
  const std::vector<double> g = RandomF(tokens * f, 11, -6, 6), u = RandomF(tokens * f, 12);
  const std::vector<double> go = RandomF(tokens * f, 13);
  std::vector<float> gf = ToFloat(g), uf = ToFloat(u), gof = ToFloat(go);
  std::vector<float> out(tokens * f), dg(tokens * f), du(tokens * f);
  ops.SwiGLU(F32(gf, {tokens, f}), F32(uf, {tokens, f}), F32(out, {tokens, f}));
  ops.SwiGLUBackward(F32(gf, {tokens, f}), F32(uf, {tokens, f}), F32(gof, {tokens, f}),
                     F32(dg, {tokens, f}), F32(du, {tokens, f}));
  std::vector<double> o(tokens * f), ddg(tokens * f), ddu(tokens * f);
  cpu::SwiGLU(g.data(), u.data(), tokens * f, o.data());
  cpu::SwiGLUBackward(g.data(), u.data(), go.data(), tokens * f, ddg.data(), ddu.data());
  EXPECT_TRUE(AllNear(out, o, 1e-6, 1e-6));
  EXPECT_TRUE(AllNear(dg, ddg, 1e-6, 1e-6));
  EXPECT_TRUE(AllNear(du, ddu, 1e-6, 1e-6));
}

// ops.h allows out to alias gate or up, dgate to alias gate and dup to alias up.
TEST(CpuOpsTest, SwiGLUInPlaceMatchesOutOfPlace) {
  CpuOps ops;
  const int64_t n = 64;
  const std::vector<float> g = ToFloat(Random(n, 20, -5, 5)), u = ToFloat(Random(n, 21));
  std::vector<float> go = ToFloat(Random(n, 22));
  std::vector<float> g1 = g, u1 = u, out(n), dg(n), du(n);
  ops.SwiGLU(F32(g1, {n}), F32(u1, {n}), F32(out, {n}));
  ops.SwiGLUBackward(F32(g1, {n}), F32(u1, {n}), F32(go, {n}), F32(dg, {n}), F32(du, {n}));
  std::vector<float> g2 = g, u2 = u;
  ops.SwiGLU(F32(g2, {n}), F32(u2, {n}), F32(g2, {n}));
  EXPECT_TRUE(AllNear(g2, out, 0.0));
  g2 = g;
  ops.SwiGLUBackward(F32(g2, {n}), F32(u2, {n}), F32(go, {n}), F32(g2, {n}), F32(u2, {n}));
  EXPECT_TRUE(AllNear(g2, dg, 0.0));
  EXPECT_TRUE(AllNear(u2, du, 0.0));
}

TEST(CpuOpsTest, CrossEntropyMatchesDoubleInPlace) {
  CpuOps ops;
  const int64_t tokens = 6, vocab = 1000;
  std::vector<int32_t> labels = {5, -100, 999, 0, 17, -1};
  const std::vector<double> logits = RandomF(tokens * vocab, 14, -8, 8);
  std::vector<float> lf = ToFloat(logits), losses(tokens, 3.0f);
  // dlogits aliases logits, as the engine uses it.
  ops.CrossEntropy(F32(lf, {tokens, vocab}), I32(labels, {tokens}), F32(losses, {tokens}),
                   F32(lf, {tokens, vocab}), 0.5f);
  std::vector<double> l(tokens), g(tokens * vocab);
  cpu::CrossEntropy(logits.data(), labels.data(), tokens, vocab, l.data(), g.data(), 0.5);
  EXPECT_TRUE(AllNear(losses, l, 1e-5, 1e-6));
  EXPECT_TRUE(AllNear(lf, g, 1e-7, 1e-5));
  EXPECT_EQ(losses[1], 0.0f);
  EXPECT_EQ(losses[5], 0.0f);
}

TEST(CpuOpsTest, LabelIsArgmaxTakesTheFirstLargestLogit) {
  CpuOps ops;
  const int64_t tokens = 6, vocab = 4;
  std::vector<float> logits = {
      0,  3,  1,  2,   // argmax 1: the label's
      0,  3,  1,  2,   // argmax 1, label 3: a miss
      5,  1,  5,  0,   // a tie of 0 and 2: the first counts, so label 2 misses
      5,  1,  5,  0,   // and label 0 hits
      0,  3,  1,  2,   // label −1: ignored, never a hit
      -9, -1, -2, -1,  // label 3 ties with 1 after it: a miss
  };
  std::vector<int32_t> labels = {1, 3, 2, 0, -1, 3};
  std::vector<float> hits(tokens, 7.f);
  ops.LabelIsArgmax(F32(logits, {tokens, vocab}), I32(labels, {tokens}), F32(hits, {tokens}));
  EXPECT_EQ(hits, (std::vector<float>{1, 0, 0, 1, 0, 0}));
}

// p0 = 1, grads 0.5 then −0.25 scaled by 2, lr 0.1, β = (0.9, 0.95), eps 1e-8, wd 0.01:
//   step 1: g = 1:    p = 0.999 − 0.1·1/(1 + 1e-8)               = 0.899000001,  m = 0.1, v = 0.05
//   step 2: g = −0.5: p = 0.899000001·0.999 − 0.1·(0.04/0.19)/(sqrt(0.06/0.0975) + 1e-8)
//                       = 0.8712640565327,                            m = 0.04, v = 0.06
TEST(CpuOpsTest, AdamWMatchesHandComputedTwoSteps) {
  CpuOps ops;
  AdamWParams p;
  p.lr = 0.1f;
  p.beta1 = 0.9f;
  p.beta2 = 0.95f;
  p.eps = 1e-8f;
  p.weight_decay = 0.01f;
  p.grad_scale = 2.0f;
  std::vector<float> master = {1.0f}, m = {0.0f}, v = {0.0f}, g = {0.5f}, working = {0.0f};
  std::vector<uint16_t> working_bf16 = {0};
  Tensor wb(working_bf16.data(), DType::kBF16, {1});
  p.step = 1;
  ops.AdamW(F32(master, {1}), F32(g, {1}), F32(m, {1}), F32(v, {1}), Tensor(), p);
  EXPECT_NEAR(master[0], 0.899000001, 3e-7);
  EXPECT_NEAR(m[0], 0.1, 1e-7);
  EXPECT_NEAR(v[0], 0.05, 1e-7);
  g[0] = -0.25f;
  p.step = 2;
  ops.AdamW(F32(master, {1}), F32(g, {1}), F32(m, {1}), F32(v, {1}), F32(working, {1}), p);
  EXPECT_NEAR(master[0], 0.8712640565327, 1e-6);
  EXPECT_NEAR(m[0], 0.04, 1e-7);
  EXPECT_NEAR(v[0], 0.06, 1e-7);
  EXPECT_EQ(working[0], master[0]);
  // A third step with a bf16 working copy (and bf16 gradient) writes the rounded weights.
  bf16 gb = FloatToBf16(0.125f);
  p.step = 3;
  ops.AdamW(F32(master, {1}), Tensor(&gb, DType::kBF16, {1}), F32(m, {1}), F32(v, {1}), wb, p);
  EXPECT_EQ(working_bf16[0], FloatToBf16(master[0]).bits);
}

TEST(CpuOpsTest, AdamWMatchesFormulaOnManyElements) {
  CpuOps ops;
  const int64_t n = 50000;  // large enough for the parallel path
  AdamWParams p;
  p.lr = 3e-3f;
  p.weight_decay = 0.1f;
  p.grad_scale = 0.7f;
  std::vector<double> pd = RandomF(n, 15), md(n, 0.0), vd(n, 0.0);
  std::vector<float> pf = ToFloat(pd), mf(n, 0.0f), vf(n, 0.0f);
  for (int64_t step = 1; step <= 3; ++step) {
    const std::vector<double> g = RandomF(n, 100 + step);
    std::vector<float> gf = ToFloat(g);
    p.step = step;
    ops.AdamW(F32(pf, {n}), F32(gf, {n}), F32(mf, {n}), F32(vf, {n}), Tensor(), p);
    const double b1 = p.beta1, b2 = p.beta2;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * static_cast<double>(p.grad_scale);
      pd[i] -= double{p.lr} * double{p.weight_decay} * pd[i];
      md[i] = b1 * md[i] + (1 - b1) * gi;
      vd[i] = b2 * vd[i] + (1 - b2) * gi * gi;
      const double mhat = md[i] / (1 - std::pow(b1, step)), vhat = vd[i] / (1 - std::pow(b2, step));
      pd[i] -= double{p.lr} * mhat / (std::sqrt(vhat) + double{p.eps});
    }
  }
  EXPECT_TRUE(AllNear(pf, pd, 1e-6, 1e-6));
  EXPECT_TRUE(AllNear(mf, md, 1e-7, 1e-6));
  EXPECT_TRUE(AllNear(vf, vd, 1e-8, 1e-6));
}

TEST(CpuOpsTest, UploadAndDownloadRoundBf16ToNearestEven) {
  CpuOps ops;
  const float e8 = std::ldexp(1.0f, -8);
  // Ties go to the even neighbour; anything above a tie rounds up.
  std::vector<float> host = {1.0f + e8, 1.0f + 3 * e8, 1.0f + e8 + std::ldexp(1.0f, -20), -2.5f};
  const std::vector<float> rounded = {1.0f, 1.0f + 4 * e8, 1.0f + 2 * e8, -2.5f};
  std::vector<uint16_t> dev(host.size());
  Tensor t(dev.data(), DType::kBF16, {2, 2});
  ops.Upload(host.data(), DType::kF32, t);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_EQ(dev[i], FloatToBf16(rounded[i]).bits) << i;
    EXPECT_EQ(Bf16ToFloat(bf16{dev[i]}), rounded[i]) << i;
  }
  std::vector<float> back(host.size());
  ops.Download(t, back.data(), DType::kF32);
  EXPECT_TRUE(AllNear(back, rounded, 0.0));
  // The other direction: an f32 tensor downloaded as bf16, uploaded back as f32.
  std::vector<uint16_t> host_bf16(host.size());
  ops.Download(F32(host, {4}), host_bf16.data(), DType::kBF16);
  EXPECT_EQ(std::memcmp(host_bf16.data(), dev.data(), 2 * dev.size()), 0);
  std::vector<float> f(host.size());
  ops.Upload(host_bf16.data(), DType::kBF16, F32(f, {4}));
  EXPECT_TRUE(AllNear(f, rounded, 0.0));
}

TEST(CpuOpsTest, CopyFillAxpyAndSums) {
  CpuOps ops;
  std::vector<int32_t> ids = {1, -2, 300}, ids2(3);
  ops.Upload(ids.data(), DType::kI32, I32(ids2, {3}));
  EXPECT_EQ(ids2, ids);
  ops.Fill(I32(ids2, {3}), 7.0f);
  EXPECT_EQ(ids2, (std::vector<int32_t>{7, 7, 7}));

  std::vector<float> x = {0.1f, -2.0f, 3.0f, 1e-3f}, y(4), z(4);
  std::vector<uint16_t> xb(4);
  ops.Copy(F32(x, {4}), Tensor(xb.data(), DType::kBF16, {2, 2}));
  ops.Copy(Tensor(xb.data(), DType::kBF16, {4}), F32(z, {4}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(z[i], Bf16ToFloat(FloatToBf16(x[i])));
  ops.Fill(F32(y, {4}), 1.5f);
  ops.Axpy(2.0f, F32(x, {4}), F32(y, {4}));
  EXPECT_TRUE(AllNear(y, std::vector<double>{1.7, -2.5, 7.5, 1.502}, 1e-6));
  EXPECT_NEAR(ops.Sum(F32(x, {4})), 1.101, 1e-6);
  EXPECT_NEAR(ops.SumSquares(F32(x, {4})), 0.01 + 4 + 9 + 1e-6, 1e-6);
  EXPECT_EQ(ops.Sum(Tensor(xb.data(), DType::kBF16, {4})), double{z[0]} + z[1] + z[2] + z[3]);
}

// The device-scalar sums are the host-value sums rounded once to f32, into a one-element view.
TEST(CpuOpsTest, SumsIntoADeviceScalar) {
  CpuOps ops;
  std::vector<float> x = {0.1f, -2.0f, 3.0f, 1e-3f, 7.25f}, out = {-1.f, -1.f, -1.f};
  std::vector<uint16_t> xb(5);
  ops.Copy(F32(x, {5}), Tensor(xb.data(), DType::kBF16, {5}));
  const Tensor o = F32(out, {3});
  ops.SumInto(F32(x, {5}), o.Slice(1, {1}));
  EXPECT_EQ(out[1], static_cast<float>(ops.Sum(F32(x, {5}))));
  EXPECT_EQ(out[0], -1.f);
  EXPECT_EQ(out[2], -1.f);
  ops.SumSquaresInto(Tensor(xb.data(), DType::kBF16, {5}), o.Slice(2, {1}));
  EXPECT_EQ(out[2], static_cast<float>(ops.SumSquares(Tensor(xb.data(), DType::kBF16, {5}))));
  ops.SumInto(F32(x, {0}), o.Slice(0, {1}));
  EXPECT_EQ(out[0], 0.f);
}

// Every output element is owned by one thread and summed in a fixed order, so the thread count
// must not change a single bit (the oracle is reproducible).
TEST(CpuOpsTest, ResultsAreBitIdenticalAcrossThreadCounts) {
  const int64_t m = 300, n = 700, k = 200, s = 70, hq = 4, hkv = 2, d = 16;
  const std::vector<float> a = ToFloat(Random(m * k, 30)), b = ToFloat(Random(n * k, 31));
  const std::vector<float> q = ToFloat(Random(s * hq * d, 32)),
                           kv = ToFloat(Random(s * hkv * d, 33));
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    CpuOps ops(cpu::AttentionBlocks{16, 8});
    std::vector<float> av = a, bv = b, c(m * n), qv = q, kk = kv, vv = kv, o(q.size()), l(hq * s);
    std::vector<float> dq(q.size()), dk(kv.size()), dv(kv.size());
    ops.Gemm(F32(av, {m, k}), false, F32(bv, {n, k}), true, F32(c, {m, n}), 1.0f, 0.0f);
    ops.Attention(F32(qv, {s, hq, d}), F32(kk, {s, hkv, d}), F32(vv, {s, hkv, d}),
                  F32(o, {s, hq, d}), F32(l, {hq, s}), {});
    ops.AttentionBackward(F32(qv, {s, hq, d}), F32(kk, {s, hkv, d}), F32(vv, {s, hkv, d}),
                          F32(o, {s, hq, d}), F32(qv, {s, hq, d}), F32(l, {hq, s}),
                          F32(dq, {s, hq, d}), F32(dk, {s, hkv, d}), F32(dv, {s, hkv, d}), {});
    for (const auto* part : {&o, &l, &dq, &dk, &dv}) c.insert(c.end(), part->begin(), part->end());
    return c;
  };
  const int saved = omp_get_max_threads();
  const std::vector<float> one = run(1), three = run(3);
  omp_set_num_threads(saved);
  EXPECT_TRUE(AllNear(three, one, 0.0));
}

TEST(CpuOpsDeathTest, ChecksShapesAndDTypes) {
  // Re-exec rather than fork: forking a process with a live OpenMP pool is unsafe.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CpuOps ops;
  std::vector<float> a(12), b(12);
  std::vector<int32_t> ids(3);
  EXPECT_DEATH(ops.Copy(I32(ids, {3}), F32(a, {3})), "cannot convert i32 to f32");
  EXPECT_DEATH(ops.SwiGLU(F32(a, {3, 4}), F32(b, {4, 3}), F32(a, {3, 4})), "SwiGLU: up");
  EXPECT_DEATH(ops.Attention(F32(a, {1, 3, 4}), F32(b, {1, 2, 4}), F32(b, {1, 2, 4}),
                             F32(a, {1, 3, 4}), F32(a, {3, 1}), {}),
               "not a GQA pair");
  EXPECT_DEATH(ops.Embedding(F32(a, {3}), F32(b, {4, 3}), F32(a, {3, 3})), "Embedding: ids");
  ids = {0, 4, 1};
  EXPECT_DEATH(ops.Embedding(I32(ids, {3}), F32(b, {4, 3}), F32(a, {3, 3})),
               "id 4 at token 1 outside");
}

}  // namespace
}  // namespace ithaca

namespace ithaca {
namespace {

TEST(CpuOpsTest, Copy2DPacksHeadGroups) {
  // [s=3, P=2, c=2] -> [P, s, c]: the Ulysses pack.
  std::vector<float> src(12), dst(12, -1.f);
  for (int i = 0; i < 12; ++i) src[i] = i;
  CpuOps ops;
  Tensor s(src.data(), DType::kF32, {12}), d(dst.data(), DType::kF32, {12});
  for (int j = 0; j < 2; ++j) ops.Copy2D(s.Slice(j * 2, {10}), 4, d.Slice(j * 6, {6}), 2, 3, 2);
  EXPECT_EQ(dst, (std::vector<float>{0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11}));
  // The base-class default (a Copy per row) agrees.
  std::vector<float> dst2(12, -1.f);
  Tensor d2(dst2.data(), DType::kF32, {12});
  for (int j = 0; j < 2; ++j) {
    ops.Ops::Copy2D(s.Slice(j * 2, {10}), 4, d2.Slice(j * 6, {6}), 2, 3, 2);
  }
  EXPECT_EQ(dst2, dst);
}

}  // namespace
}  // namespace ithaca
