// RecomputePolicy: what each block keeps from its forward for its backward. The step schedule
// (llama.h) acts on it; the job spec (memory.recompute) and the planner only name it, so it sits
// in its own target with no dependencies.
#pragma once

namespace ithaca {

// kNone keeps every activation backward needs; kFull keeps only each block's input and re-runs
// the block's forward before its backward; kAttentionAware also keeps the attention output O and
// its LSE with the input, so the recompute skips attention.
enum class RecomputePolicy { kNone, kFull, kAttentionAware };
const char* RecomputePolicyName(RecomputePolicy p);  // "none" | "full" | "attention-aware"

}  // namespace ithaca
