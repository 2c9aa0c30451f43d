// Where each rank's tokens sit (token_runs.h RankTokenRuns): every position of the sample is held
// by exactly one rank, once; without a ring each rank holds one run, with one the groups hold the
// zigzag pieces (g and 2r-1-g), so every group sees the same causal work.
#include <vector>

#include "engine/parallel/token_runs.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

TEST(TokenRunsTest, EveryPositionOnceAndTheGroupsMirrored) {
  struct Layout {
    int64_t u, r, s;
  };
  for (const Layout l : {Layout{8, 1, 5}, Layout{4, 2, 8}, Layout{1, 4, 6}, Layout{3, 2, 4}}) {
    SCOPED_TRACE(::testing::Message() << "u " << l.u << " r " << l.r << " s " << l.s);
    const int64_t sp = l.u * l.r, S = sp * l.s;
    std::vector<int> held(static_cast<size_t>(S), 0);
    std::vector<int64_t> group_pairs(static_cast<size_t>(l.r), 0);  // causal (q, k) pairs
    for (int64_t rank = 0; rank < sp; ++rank) {
      const TokenRuns t = RankTokenRuns(rank, l.u, l.r, l.s);
      ASSERT_GE(t.n, 1);
      ASSERT_LE(t.n, l.r > 1 ? 2 : 1);
      int64_t local = 0;
      for (int i = 0; i < t.n; ++i) {
        EXPECT_EQ(t.run[i].local, local);
        local += t.run[i].len;
        for (int64_t p = t.run[i].pos; p < t.run[i].pos + t.run[i].len; ++p) {
          ASSERT_LT(p, S);
          ++held[static_cast<size_t>(p)];
          group_pairs[static_cast<size_t>(rank / l.u)] += p + 1;
        }
      }
      EXPECT_EQ(local, l.s);
    }
    for (int64_t p = 0; p < S; ++p) EXPECT_EQ(held[static_cast<size_t>(p)], 1) << "position " << p;
    // Zigzag: each group's queries see the same number of keys in all.
    for (int64_t g = 1; g < l.r; ++g) EXPECT_EQ(group_pairs[g], group_pairs[0]) << "group " << g;
  }
  // Without a ring: rank 3 of 8 holds [15, 20).
  const TokenRuns plain = RankTokenRuns(3, 8, 1, 5);
  EXPECT_EQ(plain.run[0].pos, 15);
  // u 4 x r 2, s 8 (S 64, pieces of 16): group 0 holds [0, 16) and [48, 64); its rank 1 holds
  // [8, 16) and rank 2 [48, 56).
  EXPECT_EQ(RankTokenRuns(1, 4, 2, 8).run[0].pos, 8);
  EXPECT_EQ(RankTokenRuns(2, 4, 2, 8).run[0].pos, 48);
  // u 3 x r 2, s 4 (pieces of 6): group 0's rank 1 holds [4, 6) and [18, 20), straddling.
  const TokenRuns straddle = RankTokenRuns(1, 3, 2, 4);
  ASSERT_EQ(straddle.n, 2);
  EXPECT_EQ(straddle.run[0].pos, 4);
  EXPECT_EQ(straddle.run[0].len, 2);
  EXPECT_EQ(straddle.run[1].pos, 18);
  EXPECT_EQ(straddle.run[1].local, 2);
}

}  // namespace
}  // namespace ithaca
