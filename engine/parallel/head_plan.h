// HeadPlan: which attention heads each rank of a Ulysses group handles in each UPipe stage.
//
// Rank j of P owns query heads [j·Hq/P, (j+1)·Hq/P) and, when Hkv ≥ P, K/V heads
// [j·Hkv/P, (j+1)·Hkv/P); when Hkv < P (P % Hkv == 0) K/V head ⌊j·Hkv/P⌋ is replicated to it.
// Attention runs in rounds of `kvr` K/V heads per rank (projected and exchanged once per round)
// and, inside a round, in stages of `u` query heads per rank (U = u·P heads per stage in the
// group). Every head range below is contiguous, so each projection is one GEMM on a row block of
// the weight, written straight into its all-to-all slot.
#pragma once

#include <cstdint>

#include "engine/core/status.h"
#include "engine/model/config.h"

namespace ithaca {

struct HeadPlan {
  int64_t P = 1;  // Ulysses group size
  int64_t hq = 0, hkv = 0, g = 1, D = 0;
  int64_t u = 0;       // query heads per rank per stage
  int64_t kvr = 0;     // K/V heads per rank per round
  int64_t rounds = 0;  // K/V rounds
  int64_t stages_per_round = 0;
  bool replicated = false;  // Hkv < P: K/V heads replicated, their gradients summed

  int64_t stages() const { return rounds * stages_per_round; }
  // First query head that rank j handles in round k, stage t (u heads from there).
  int64_t QHead(int64_t j, int64_t k, int64_t t) const {
    return j * (hq / P) + (k * stages_per_round + t) * u;
  }
  // First K/V head that rank j holds in round k (kvr heads from there).
  int64_t KvHead(int64_t j, int64_t k) const {
    return replicated ? j * hkv / P : j * (hkv / P) + k * kvr;
  }
};

// `head_chunk` is U, the query heads per stage over the whole group (0 = all heads: plain
// Ulysses). INVALID_ARGUMENT naming the setting when the heads cannot be split that way
// (engine/spec/validate.h CheckHeadSplit).
absl::StatusOr<HeadPlan> MakeHeadPlan(const LlamaConfig& cfg, int64_t P, int64_t head_chunk);

}  // namespace ithaca
