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

std::optional<RecomputePolicy> RecomputePolicyFromName(std::string_view name) {
  return ValueOf(kRecomputePolicyNames, name);
}

std::vector<std::pair<RecomputePolicy, std::string>> RecomputePolicyNames() {
  std::vector<std::pair<RecomputePolicy, std::string>> out;
  for (const EnumName<RecomputePolicy>& e : kRecomputePolicyNames)
    out.emplace_back(e.value, e.name);
  return out;
}

}  // namespace ithaca
