#include "engine/parallel/token_runs.h"

#include <algorithm>

namespace ithaca {

TokenRuns GroupTokenRuns(int64_t group, int64_t ring, int64_t piece, int64_t first, int64_t count) {
  TokenRuns t;
  if (ring <= 1) {
    t.n = 1;
    t.run[0] = {0, first, count};
    return t;
  }
  // Piece 0 of the group is the sample's piece `group`, piece 1 its mirror 2r − 1 − group.
  const int64_t starts[2] = {group * piece, (2 * ring - 1 - group) * piece};
  for (int p = 0; p < 2; ++p) {
    const int64_t lo = std::max(first, p * piece), hi = std::min(first + count, (p + 1) * piece);
    if (lo < hi) t.run[t.n++] = {lo - first, starts[p] + (lo - p * piece), hi - lo};
  }
  return t;
}

TokenRuns RankTokenRuns(int64_t sp_rank, int64_t u, int64_t r, int64_t s) {
  // Without a ring the one group is the whole sample (sp_rank / u = 0, sp_rank % u = sp_rank).
  return GroupTokenRuns(sp_rank / u, r, u * s / 2, (sp_rank % u) * s, s);
}

}  // namespace ithaca
