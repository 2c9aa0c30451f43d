#include "engine/spec/recompute_policy.h"

namespace ithaca {

const char* RecomputePolicyName(RecomputePolicy p) {
  switch (p) {
    case RecomputePolicy::kNone:
      return "none";
    case RecomputePolicy::kFull:
      return "full";
    case RecomputePolicy::kAttentionAware:
      return "attention-aware";
    case RecomputePolicy::kAuto:
      return "auto";
  }
  return "unknown";
}

}  // namespace ithaca
