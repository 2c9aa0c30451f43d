// Tests of the flash-style causal GQA attention in double: the forward against a naive O(S²)
// reference, the backward against finite differences, both with blocks small enough that S is
// split into several ragged blocks.
#include "engine/backend/cpu/attention.h"

#include <cmath>
#include <limits>
#include <ostream>

#include "engine/backend/cpu/test_util.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

using cpu_test::AllNear;
using cpu_test::Dot;
using cpu_test::NumericGradient;
using cpu_test::Random;

struct Dims {
  int64_t s, hq, hkv, d;
};

// Softmax over the full row of scaled logits, masked to keys j <= i.
void NaiveAttention(const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const Dims& dm, std::vector<double>* out,
                    std::vector<double>* lse) {
  out->assign(dm.s * dm.hq * dm.d, 0.0);
  lse->assign(dm.hq * dm.s, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dm.d));
  std::vector<double> logits(dm.s);
  for (int64_t h = 0; h < dm.hq; ++h) {
    const int64_t g = h / (dm.hq / dm.hkv);
    for (int64_t i = 0; i < dm.s; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < dm.d; ++e) {
          dot += q[(i * dm.hq + h) * dm.d + e] * k[(j * dm.hkv + g) * dm.d + e];
        }
        logits[j] = dot * scale;
        mx = std::max(mx, logits[j]);
      }
      double z = 0.0;
      for (int64_t j = 0; j <= i; ++j) z += std::exp(logits[j] - mx);
      (*lse)[h * dm.s + i] = mx + std::log(z);
      for (int64_t j = 0; j <= i; ++j) {
        const double p = std::exp(logits[j] - mx) / z;
        for (int64_t e = 0; e < dm.d; ++e) {
          (*out)[(i * dm.hq + h) * dm.d + e] += p * v[(j * dm.hkv + g) * dm.d + e];
        }
      }
    }
  }
}

struct Case {
  Dims dims;
  cpu::AttentionBlocks blocks;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "S=" << c.dims.s << " Hq=" << c.dims.hq << " Hkv=" << c.dims.hkv << " D=" << c.dims.d
      << " blocks=" << c.blocks.q << "x" << c.blocks.k;
}

class AttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionTest, ForwardMatchesNaiveReference) {
  const Dims dm = GetParam().dims;
  // Scale q up so the softmax is peaked and the online max actually moves between blocks.
  const std::vector<double> q = Random(dm.s * dm.hq * dm.d, 1, -3.0, 3.0);
  const std::vector<double> k = Random(dm.s * dm.hkv * dm.d, 2, -3.0, 3.0);
  const std::vector<double> v = Random(dm.s * dm.hkv * dm.d, 3);
  std::vector<double> out(q.size(), 7.0), lse(dm.hq * dm.s, 7.0), want_out, want_lse;
  cpu::AttentionForward(q.data(), k.data(), v.data(), dm.s, dm.hq, dm.hkv, dm.d, out.data(),
                        lse.data(), GetParam().blocks);
  NaiveAttention(q, k, v, dm, &want_out, &want_lse);
  EXPECT_TRUE(AllNear(out, want_out, 1e-12));
  EXPECT_TRUE(AllNear(lse, want_lse, 1e-12));
}

// L = <out, R>; dq, dk, dv are written, so they start as garbage.
TEST_P(AttentionTest, BackwardMatchesFiniteDifferences) {
  const Dims dm = GetParam().dims;
  const cpu::AttentionBlocks blocks = GetParam().blocks;
  std::vector<double> q = Random(dm.s * dm.hq * dm.d, 4, -2.0, 2.0);
  std::vector<double> k = Random(dm.s * dm.hkv * dm.d, 5, -2.0, 2.0);
  std::vector<double> v = Random(dm.s * dm.hkv * dm.d, 6);
  const std::vector<double> r = Random(q.size(), 7);
  std::vector<double> out(q.size()), lse(dm.hq * dm.s);
  auto loss = [&] {
    cpu::AttentionForward(q.data(), k.data(), v.data(), dm.s, dm.hq, dm.hkv, dm.d, out.data(),
                          lse.data(), blocks);
    return Dot(out, r);
  };
  loss();
  std::vector<double> dq(q.size(), 5.0), dk(k.size(), 5.0), dv(v.size(), 5.0);
  cpu::AttentionBackward(q.data(), k.data(), v.data(), out.data(), r.data(), lse.data(), dm.s,
                         dm.hq, dm.hkv, dm.d, dq.data(), dk.data(), dv.data(), blocks);
  EXPECT_TRUE(AllNear(dq, NumericGradient(loss, &q), 1e-8));
  EXPECT_TRUE(AllNear(dk, NumericGradient(loss, &k), 1e-8));
  EXPECT_TRUE(AllNear(dv, NumericGradient(loss, &v), 1e-8));
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionTest,
                         ::testing::Values(Case{{13, 4, 2, 8}, {4, 4}},  // GQA, ragged last block
                                           Case{{13, 4, 2, 8},
                                                {3, 5}},  // query and key blocks misaligned
                                           Case{{13, 4, 2, 8}, {64, 64}},  // one block
                                           Case{{9, 3, 1, 6}, {2, 4}},     // MQA
                                           Case{{10, 2, 2, 4}, {5, 2}},    // MHA
                                           Case{{1, 2, 1, 4}, {4, 4}}));   // a single token

TEST(AttentionBlocksTest, ResultsDoNotDependOnBlockSizesBeyondRounding) {
  const Dims dm{37, 4, 2, 16};
  const std::vector<double> q = Random(dm.s * dm.hq * dm.d, 8, -2.0, 2.0);
  const std::vector<double> k = Random(dm.s * dm.hkv * dm.d, 9, -2.0, 2.0);
  const std::vector<double> v = Random(dm.s * dm.hkv * dm.d, 10);
  const std::vector<double> go = Random(q.size(), 11);
  std::vector<std::vector<double>> results;
  for (const cpu::AttentionBlocks b : {cpu::AttentionBlocks{64, 64}, {8, 16}, {7, 3}}) {
    std::vector<double> out(q.size()), lse(dm.hq * dm.s), dq(q.size()), dk(k.size()), dv(v.size());
    cpu::AttentionForward(q.data(), k.data(), v.data(), dm.s, dm.hq, dm.hkv, dm.d, out.data(),
                          lse.data(), b);
    cpu::AttentionBackward(q.data(), k.data(), v.data(), out.data(), go.data(), lse.data(), dm.s,
                           dm.hq, dm.hkv, dm.d, dq.data(), dk.data(), dv.data(), b);
    std::vector<double> all = out;
    for (const auto* part : {&lse, &dq, &dk, &dv})
      all.insert(all.end(), part->begin(), part->end());
    results.push_back(all);
  }
  EXPECT_TRUE(AllNear(results[1], results[0], 1e-12));
  EXPECT_TRUE(AllNear(results[2], results[0], 1e-12));
}

}  // namespace
}  // namespace ithaca
