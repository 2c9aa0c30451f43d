#include "client/max_seq_len.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace ithaca {
namespace {

constexpr int64_t kM = 65536, kMax = int64_t{1} << 27;

// A job whose plans fit up to `fits_to`, and whose plans from `slow_from` on run past the
// daemon's bound (issue 54 U2: Llama-3-8B on h100x8 proved 8M, then timed out at 16M).
auto Daemon(int64_t fits_to, int64_t slow_from) {
  return [=](int64_t n) -> absl::StatusOr<LengthVerdict> {
    if (n >= slow_from) return LengthVerdict::kTimedOut;
    return n <= fits_to ? LengthVerdict::kFits : LengthVerdict::kDoesNotFit;
  };
}

TEST(MaxSeqLenTest, FindsTheLongestLengthThatFits) {
  for (int64_t fits_to : {kM, 3 * kM, 100 * kM, 128 * kM, 1000 * kM}) {
    SCOPED_TRACE(fits_to);
    auto s = FindMaxSeqLen(kM, kMax, Daemon(fits_to, kMax + 1));
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->longest, fits_to);
    EXPECT_EQ(s->not_fitting, fits_to + kM);
    EXPECT_TRUE(s->timed_out.empty());
  }
  auto none = FindMaxSeqLen(kM, kMax, Daemon(kM - 1, kMax + 1));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->longest, 0);
  EXPECT_EQ(none->asked, 1);
}

// A length whose plan does not finish is narrowed below, as one that does not fit: the answer
// is the longest length proven to fit, never none.
TEST(MaxSeqLenTest, ATimeoutIsNarrowedBelow) {
  // 8M fits, 16M times out (the case); everything from 12M on is slow.
  auto s = FindMaxSeqLen(kM, kMax, Daemon(10 * 1024 * 1024, 12 * 1024 * 1024));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->longest, 10 * 1024 * 1024);
  EXPECT_EQ(s->not_fitting, 10 * 1024 * 1024 + kM);
  ASSERT_FALSE(s->timed_out.empty());
  EXPECT_EQ(s->timed_out.front(), 16 * 1024 * 1024);
  // Slow before it stops fitting: the longest length that finished and fits.
  auto slow = FindMaxSeqLen(kM, kMax, Daemon(14 * 1024 * 1024, 12 * 1024 * 1024));
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->longest, 12 * 1024 * 1024 - kM);
  EXPECT_EQ(slow->not_fitting, 0);
  // Only the shortest length finishes.
  auto first = FindMaxSeqLen(kM, kMax, Daemon(kMax, 2 * kM));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->longest, kM);
}

// Another error ends the search, and what it proved is kept for the caller to print.
TEST(MaxSeqLenTest, AnErrorKeepsWhatWasProven) {
  MaxSeqLenSearch so_far;
  auto s = FindMaxSeqLen(
      kM, kMax,
      [](int64_t n) -> absl::StatusOr<LengthVerdict> {
        if (n > 8 * 1024 * 1024) return absl::UnavailableError("the daemon went away");
        return LengthVerdict::kFits;
      },
      &so_far);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(so_far.longest, 8 * 1024 * 1024);
}

}  // namespace
}  // namespace ithaca
