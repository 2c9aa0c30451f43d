#include "engine/parallel/head_plan.h"

namespace ithaca {

absl::StatusOr<HeadPlan> MakeHeadPlan(const LlamaConfig& cfg, int64_t P, int64_t head_chunk) {
  HeadPlan p;
  p.P = P;
  p.hq = cfg.num_attention_heads;
  p.hkv = cfg.num_key_value_heads;
  p.D = cfg.head_dim;
  p.g = p.hq / p.hkv;
  if (P < 1 || p.hq % P != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.sp: ", P, " must divide the query heads (", p.hq, ")"));
  }
  if (p.hkv % P != 0 && P % p.hkv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.sp: ", P, " and the key/value heads (",
                                                   p.hkv, ") must divide one another"));
  }
  p.replicated = p.hkv < P;
  const int64_t U = head_chunk > 0 ? head_chunk : p.hq;
  if (U % P != 0 || (p.hq / P) % (U / P) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "memory.head_chunk: ", U, " heads per stage must be a multiple of parallel.sp (", P,
        ") that divides the ", p.hq, " query heads into equal stages per rank"));
  }
  p.u = U / P;
  if (p.replicated) {
    // All of a rank's query heads share its one (replicated) K/V head.
    p.kvr = 1;
    p.rounds = 1;
    p.stages_per_round = (p.hq / P) / p.u;
    return p;
  }
  if (p.u <= p.g) {
    if (p.g % p.u != 0) {
      return absl::InvalidArgumentError(absl::StrCat("memory.head_chunk: ", U, " (", p.u,
                                                     " per rank) must divide the GQA group of ",
                                                     p.g, " query heads per K/V head"));
    }
    p.kvr = 1;
    p.stages_per_round = p.g / p.u;
  } else {
    if (p.u % p.g != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "memory.head_chunk: ", U, " (", p.u, " per rank) must be a multiple of the GQA group of ",
          p.g, " query heads per K/V head"));
    }
    p.kvr = p.u / p.g;
    p.stages_per_round = 1;
  }
  p.rounds = (p.hkv / P) / p.kvr;
  return p;
}

}  // namespace ithaca
