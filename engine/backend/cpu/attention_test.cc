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

// Softmax over the full row of scaled logits, masked to keys j <= i (and, with `visible`, to the
// keys it allows).
template <typename Visible>
void NaiveAttention(const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const Dims& dm, std::vector<double>* out,
                    std::vector<double>* lse, Visible visible) {
  out->assign(dm.s * dm.hq * dm.d, 0.0);
  lse->assign(dm.hq * dm.s, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dm.d));
  std::vector<double> logits(dm.s);
  for (int64_t h = 0; h < dm.hq; ++h) {
    const int64_t g = h / (dm.hq / dm.hkv);
    for (int64_t i = 0; i < dm.s; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= i; ++j) {
        logits[j] = -std::numeric_limits<double>::infinity();
        if (!visible(i, j)) continue;
        double dot = 0.0;
        for (int64_t e = 0; e < dm.d; ++e) {
          dot += q[(i * dm.hq + h) * dm.d + e] * k[(j * dm.hkv + g) * dm.d + e];
        }
        logits[j] = dot * scale;
        mx = std::max(mx, logits[j]);
      }
      double z = 0.0;
      for (int64_t j = 0; j <= i; ++j) z += visible(i, j) ? std::exp(logits[j] - mx) : 0.0;
      (*lse)[h * dm.s + i] = mx + std::log(z);
      for (int64_t j = 0; j <= i; ++j) {
        if (!visible(i, j)) continue;
        const double p = std::exp(logits[j] - mx) / z;
        for (int64_t e = 0; e < dm.d; ++e) {
          (*out)[(i * dm.hq + h) * dm.d + e] += p * v[(j * dm.hkv + g) * dm.d + e];
        }
      }
    }
  }
}

void NaiveAttention(const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const Dims& dm, std::vector<double>* out,
                    std::vector<double>* lse) {
  NaiveAttention(q, k, v, dm, out, lse, [](int64_t, int64_t) { return true; });
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

// Sliding windows (Mistral's: query i sees keys j with i − window < j ≤ i), alone and with
// documents: smaller than a block, of one key, larger than S, with documents of one token.
struct WindowCase {
  Dims dims;
  cpu::AttentionBlocks blocks;
  int64_t window;
  std::vector<int64_t> docs;  // document starts; empty: one
};

void PrintTo(const WindowCase& c, std::ostream* os) {
  *os << "S=" << c.dims.s << " blocks=" << c.blocks.q << "x" << c.blocks.k << " window " << c.window
      << " docs " << c.docs.size();
}

class WindowedAttentionTest : public ::testing::TestWithParam<WindowCase> {};

TEST_P(WindowedAttentionTest, ForwardMatchesNaiveReference) {
  const WindowCase& c = GetParam();
  const Dims dm = c.dims;
  const std::vector<double> q = Random(dm.s * dm.hq * dm.d, 21, -3.0, 3.0);
  const std::vector<double> k = Random(dm.s * dm.hkv * dm.d, 22, -3.0, 3.0);
  const std::vector<double> v = Random(dm.s * dm.hkv * dm.d, 23);
  std::vector<int64_t> doc_of(dm.s, 0);
  for (size_t di = 1; di < c.docs.size(); ++di) {
    for (int64_t i = c.docs[di]; i < dm.s; ++i) doc_of[i] = static_cast<int64_t>(di);
  }
  auto visible = [&](int64_t i, int64_t j) { return i - j < c.window && doc_of[i] == doc_of[j]; };
  std::vector<double> out(q.size(), 7.0), lse(dm.hq * dm.s, 7.0), want_out, want_lse;
  cpu::AttentionForward(q.data(), k.data(), v.data(), dm.s, dm.hq, dm.hkv, dm.d, out.data(),
                        lse.data(), c.blocks, c.docs.data(), static_cast<int64_t>(c.docs.size()),
                        c.window);
  NaiveAttention(q, k, v, dm, &want_out, &want_lse, visible);
  EXPECT_TRUE(AllNear(out, want_out, 1e-12));
  EXPECT_TRUE(AllNear(lse, want_lse, 1e-12));
  // The window changes the result wherever it hides a key (S > window).
  std::vector<double> full_out, full_lse;
  NaiveAttention(q, k, v, dm, &full_out, &full_lse,
                 [&](int64_t i, int64_t j) { return doc_of[i] == doc_of[j]; });
  if (c.window < dm.s) {
    EXPECT_FALSE(AllNear(out, full_out, 1e-6));
  }
}

TEST_P(WindowedAttentionTest, BackwardMatchesFiniteDifferences) {
  const WindowCase& c = GetParam();
  const Dims dm = c.dims;
  std::vector<double> q = Random(dm.s * dm.hq * dm.d, 24, -2.0, 2.0);
  std::vector<double> k = Random(dm.s * dm.hkv * dm.d, 25, -2.0, 2.0);
  std::vector<double> v = Random(dm.s * dm.hkv * dm.d, 26);
  const std::vector<double> r = Random(q.size(), 27);
  std::vector<double> out(q.size()), lse(dm.hq * dm.s);
  const int64_t nd = static_cast<int64_t>(c.docs.size());
  auto loss = [&] {
    cpu::AttentionForward(q.data(), k.data(), v.data(), dm.s, dm.hq, dm.hkv, dm.d, out.data(),
                          lse.data(), c.blocks, c.docs.data(), nd, c.window);
    return Dot(out, r);
  };
  loss();
  std::vector<double> dq(q.size(), 5.0), dk(k.size(), 5.0), dv(v.size(), 5.0);
  cpu::AttentionBackward(q.data(), k.data(), v.data(), out.data(), r.data(), lse.data(), dm.s,
                         dm.hq, dm.hkv, dm.d, dq.data(), dk.data(), dv.data(), c.blocks,
                         c.docs.data(), nd, c.window);
  EXPECT_TRUE(AllNear(dq, NumericGradient(loss, &q), 1e-8));
  EXPECT_TRUE(AllNear(dk, NumericGradient(loss, &k), 1e-8));
  EXPECT_TRUE(AllNear(dv, NumericGradient(loss, &v), 1e-8));
}

INSTANTIATE_TEST_SUITE_P(
    Windows, WindowedAttentionTest,
    ::testing::Values(WindowCase{{17, 4, 2, 8}, {4, 4}, 3, {}},            // smaller than a block
                      WindowCase{{17, 4, 2, 8}, {3, 5}, 6, {}},            // misaligned blocks
                      WindowCase{{17, 4, 2, 8}, {4, 4}, 1, {}},            // one key: itself
                      WindowCase{{13, 4, 2, 8}, {4, 4}, 40, {}},           // larger than S
                      WindowCase{{19, 3, 1, 6}, {2, 4}, 4, {0, 1, 2, 9}},  // with documents
                      WindowCase{{19, 2, 2, 4}, {5, 3}, 7, {0, 5, 6, 15}},
                      WindowCase{{16, 2, 1, 4}, {16, 16}, 5, {0, 8}}));  // one block

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
