#include "engine/parallel/head_plan.h"

#include "engine/spec/validate.h"

namespace ithaca {

absl::StatusOr<HeadPlan> MakeHeadPlan(const LlamaConfig& cfg, int64_t P, int64_t head_chunk) {
  RETURN_IF_ERROR(CheckHeadSplit(cfg, P, head_chunk));
  HeadPlan p;
  p.P = P;
  p.hq = cfg.num_attention_heads;
  p.hkv = cfg.num_key_value_heads;
  p.D = cfg.head_dim;
  p.g = p.hq / p.hkv;
  p.replicated = p.hkv < P;
  const int64_t U = head_chunk > 0 ? head_chunk : p.hq;
  p.u = U / P;
  if (p.replicated) {
    // All of a rank's query heads share its one (replicated) K/V head.
    p.kvr = 1;
    p.rounds = 1;
    p.stages_per_round = (p.hq / P) / p.u;
    return p;
  }
  if (p.u <= p.g) {
    p.kvr = 1;
    p.stages_per_round = p.g / p.u;
  } else {
    p.kvr = p.u / p.g;
    p.stages_per_round = 1;
  }
  p.rounds = (p.hkv / P) / p.kvr;
  return p;
}

}  // namespace ithaca
