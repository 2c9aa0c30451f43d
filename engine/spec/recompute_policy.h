// RecomputePolicy: what each block keeps from its forward for its backward. The step schedule
// (llama.h) acts on it; the job spec (memory.recompute) and the planner only name it, so it sits
// in its own target with no dependencies.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ithaca {

// kNone keeps every activation backward needs; kFull keeps only each block's input and re-runs
// the block's forward before its backward; kAttentionAware also keeps the attention output O and
// its LSE with the input, so the recompute skips attention. Under kAttentionAware a model may
// also keep O and LSE on only some blocks (LlamaModel::Options::attention_aware_blocks), the
// others recomputing fully: a per-block mix. kAuto is a job spec's only: the planner chooses the
// policy (and the mix) by predicted step time, and the schedule never sees it.
enum class RecomputePolicy { kNone, kFull, kAttentionAware, kAuto };
// "none" | "full" | "attention-aware" | "auto"
const char* RecomputePolicyName(RecomputePolicy p);
// The policy named `name` (as above), or nullopt.
std::optional<RecomputePolicy> RecomputePolicyFromName(std::string_view name);
// Every policy with its name, in the order above (the spec's key table and messages list them).
std::vector<std::pair<RecomputePolicy, std::string>> RecomputePolicyNames();

}  // namespace ithaca
