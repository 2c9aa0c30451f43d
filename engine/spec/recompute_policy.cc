#include "engine/spec/recompute_policy.h"

#include "engine/core/enum_names.h"

namespace ithaca {
namespace {

constexpr EnumName<RecomputePolicy> kRecomputePolicyNames[] = {
    {RecomputePolicy::kNone, "none"},
    {RecomputePolicy::kFull, "full"},
    {RecomputePolicy::kAttentionAware, "attention-aware"},
    {RecomputePolicy::kAuto, "auto"},
};

}  // namespace

const char* RecomputePolicyName(RecomputePolicy p) {
  return NameOf(kRecomputePolicyNames, p, "unknown");
}

}  // namespace ithaca
