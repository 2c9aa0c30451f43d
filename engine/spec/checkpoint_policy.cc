#include "engine/spec/checkpoint_policy.h"

namespace ithaca {

const char* CheckpointPolicyName(CheckpointPolicy p) {
  switch (p) {
    case CheckpointPolicy::kNone:
      return "none";
    case CheckpointPolicy::kFull:
      return "full";
    case CheckpointPolicy::kAttentionAware:
      return "attention-aware";
  }
  return "unknown";
}

}  // namespace ithaca
