// VisiblePieceRectangle (ops.h) against the mask itself, pair by pair: for ring pieces whose keys
// come before their queries, over random documents and windows, the rectangle holds exactly the
// visible pairs when it says it is dense, and a window that cuts into it is never called dense.
#include <cstdint>
#include <random>
#include <vector>

#include "engine/backend/ops.h"
#include "gtest/gtest.h"

namespace ithaca {
namespace {

// Attention's mask over a whole sample: the same document, not after the query, in the window.
bool Visible(const DocumentMask& docs, int64_t query, int64_t key) {
  if (key > query) return false;
  if (docs.window > 0 && query - key >= docs.window) return false;
  for (int64_t st : docs.starts) {
    if (st > key && st <= query) return false;  // a document starts between them
  }
  return true;
}

TEST(PieceRectangleTest, HoldsExactlyTheVisiblePairs) {
  std::mt19937_64 gen(7);
  int dense = 0, not_dense = 0, empty = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t S = 8 + static_cast<int64_t>(gen() % 120);
    DocumentMask docs;
    if (gen() % 4 != 0) {  // documents: starts[0] == 0, strictly ascending
      docs.starts.push_back(0);
      for (int64_t p = 1; p < S; ++p) {
        if (gen() % 9 == 0) docs.starts.push_back(p);
      }
    }
    if (gen() % 3 == 0) docs.window = 1 + static_cast<int64_t>(gen() % S);
    // Key piece [ka, ka + sk) before query piece [qa, qa + sq).
    const int64_t ka = static_cast<int64_t>(gen() % (S - 2));
    const int64_t sk = 1 + static_cast<int64_t>(gen() % (S - 1 - ka));
    const int64_t qa = ka + sk + static_cast<int64_t>(gen() % (S - ka - sk));
    if (qa >= S) continue;
    const int64_t sq = 1 + static_cast<int64_t>(gen() % (S - qa));
    const PieceRectangle r = VisiblePieceRectangle(docs, sq, sk, qa, ka);
    ASSERT_GE(r.queries, 0);
    ASSERT_LE(r.queries, sq);
    ASSERT_GE(r.first_key, 0);
    ASSERT_LE(r.first_key, sk);
    bool all_in_rectangle_visible = true;
    int64_t seen = 0;
    for (int64_t i = 0; i < sq; ++i) {
      for (int64_t j = 0; j < sk; ++j) {
        const bool in = i < r.queries && j >= r.first_key;
        const bool vis = Visible(docs, qa + i, ka + j);
        seen += vis ? 1 : 0;
        // Nothing outside the rectangle is ever visible.
        ASSERT_FALSE(vis && !in) << "trial " << trial << ": pair " << i << ", " << j
                                 << " visible outside the rectangle";
        if (in && !vis) all_in_rectangle_visible = false;
      }
    }
    // Dense means every pair inside is visible; not dense means a window cut into it.
    EXPECT_EQ(r.dense, all_in_rectangle_visible) << "trial " << trial;
    if (seen == 0) {
      EXPECT_TRUE(r.queries == 0 || r.first_key == sk || !r.dense) << "trial " << trial;
    }
    if (r.queries == 0 || r.first_key == sk) {
      ++empty;
    } else if (r.dense) {
      ++dense;
    } else {
      ++not_dense;
    }
  }
  // Every kind of piece came up.
  EXPECT_GT(dense, 100);
  EXPECT_GT(not_dense, 50);
  EXPECT_GT(empty, 50);
}

}  // namespace
}  // namespace ithaca
