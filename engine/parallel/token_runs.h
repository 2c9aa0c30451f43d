// Where a sequence-parallel rank's tokens sit in the sample, with and without ring attention
// (docs/schedules.md): one rule, used by the uploads of a sample's tokens and by RoPE.
#pragma once

#include <cstdint>

namespace ithaca {

// Where a rank's tokens sit in the sample. Without a ring, rank R of the sequence-parallel group
// holds the s tokens from R·s on. With a ring of r groups the sample is cut into 2r pieces of
// c = S / 2r tokens and group g holds pieces g and 2r−1−g ("zigzag": every group then has the
// same causal work, a piece near the start and its mirror near the end), concatenated; rank j of
// the group holds tokens [j·s, (j+1)·s) of that concatenation, so at most two runs of
// consecutive positions.
struct TokenRun {
  int64_t local = 0;  // first token of the run in the rank's (or group's) tokens
  int64_t pos = 0;    // its sample position
  int64_t len = 0;
};
struct TokenRuns {
  int n = 0;
  TokenRun run[2];
};
// The runs of `count` tokens from `first` of group `group`'s concatenation (ring > 1), or of the
// positions [first, first + count) (ring 1); `piece` is c.
TokenRuns GroupTokenRuns(int64_t group, int64_t ring, int64_t piece, int64_t first, int64_t count);
// Rank `sp_rank` of a sequence-parallel group of u × r ranks holding s tokens each.
TokenRuns RankTokenRuns(int64_t sp_rank, int64_t u, int64_t r, int64_t s);

}  // namespace ithaca
