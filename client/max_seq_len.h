// `ithaca plan --max-seq-len`: the search for the longest data.seq_len whose plan fits, apart
// from the daemon it asks (commands.cc asks PlanJob; the tests ask a rule).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"

namespace ithaca {

// What one length's plan said.
enum class LengthVerdict { kFits, kDoesNotFit, kTimedOut };

struct MaxSeqLenSearch {
  int64_t longest = 0;             // the longest length proven to fit (0: not even multiple_of)
  int64_t not_fitting = 0;         // the shortest length proven not to fit (0: none tried)
  std::vector<int64_t> timed_out;  // lengths whose plan ran past the daemon's bound
  int asked = 0;                   // plans asked
};

// Doubling from `multiple_of` (up to `max_len`) finds a length that does not fit, then narrowing
// from below finds the longest multiple of `multiple_of` that does. A length whose plan runs
// past the daemon's time bound (kTimedOut) is not known to fit: the search narrows below it as
// below one that does not fit, so every answer is a length proven to fit. `ask` returns the
// verdict at a length, or an error that ends the search (returned with what was proven so far
// in `*so_far`, when given).
absl::StatusOr<MaxSeqLenSearch> FindMaxSeqLen(
    int64_t multiple_of, int64_t max_len,
    const std::function<absl::StatusOr<LengthVerdict>(int64_t)>& ask,
    MaxSeqLenSearch* so_far = nullptr);

}  // namespace ithaca
