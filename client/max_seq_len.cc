#include "client/max_seq_len.h"

#include <algorithm>

namespace ithaca {

absl::StatusOr<MaxSeqLenSearch> FindMaxSeqLen(
    int64_t multiple_of, int64_t max_len,
    const std::function<absl::StatusOr<LengthVerdict>(int64_t)>& ask, MaxSeqLenSearch* so_far) {
  const int64_t m = std::max<int64_t>(1, multiple_of);
  MaxSeqLenSearch s;
  // The upper end of the search: a length that does not fit or did not finish (0: none yet).
  int64_t hi = 0;
  auto try_length = [&](int64_t n) -> absl::Status {
    absl::StatusOr<LengthVerdict> v = ask(n);
    ++s.asked;
    if (!v.ok()) {
      if (so_far != nullptr) *so_far = s;
      return v.status();
    }
    if (*v == LengthVerdict::kFits) {
      s.longest = std::max(s.longest, n);
    } else {
      if (*v == LengthVerdict::kDoesNotFit) {
        s.not_fitting = s.not_fitting == 0 ? n : std::min(s.not_fitting, n);
      } else {
        s.timed_out.push_back(n);
      }
      hi = hi == 0 ? n : std::min(hi, n);
    }
    return absl::OkStatus();
  };
  if (absl::Status st = try_length(m); !st.ok()) return st;
  if (s.longest == 0) return s;
  // Doubling finds a length that does not fit (or the bound)...
  while (hi == 0) {
    const int64_t next = std::min(s.longest * 2, max_len / m * m);
    if (next <= s.longest) break;
    if (absl::Status st = try_length(next); !st.ok()) return st;
  }
  // ...then narrowing the last that does. Not the middle: a length that fits is answered by one
  // replay (the daemon tries the configuration that fit last first), one that does not by
  // every configuration's, about 20 times as long; asking an eighth of the way up takes about
  // half the time of bisecting. Below a length that timed out, the middle: its neighbours may
  // take as long.
  while (hi > 0 && hi - s.longest > m) {
    const int64_t lo = s.longest;
    const bool timeout_above =
        !s.timed_out.empty() && hi == *std::min_element(s.timed_out.begin(), s.timed_out.end());
    const int64_t step = timeout_above ? (hi - lo) / 2 : (hi - lo) / 8;
    const int64_t probe = std::min(hi - m, std::max(lo + m, (lo + step) / m * m));
    if (absl::Status st = try_length(probe); !st.ok()) return st;
  }
  return s;
}

}  // namespace ithaca
