// ResolveJob: the one place a job's "auto" settings become numbers. Admission resolves a
// submitted job once, against the node's memory; the resolved spec (its canonical TOML) is what
// the job store keeps, `ithaca status` shows and every worker runs as it is. Standalone runs and
// `--plan` resolve with the same function. Resolving a resolved spec changes nothing, on any
// node: every budget and setting is then explicit.
#pragma once

#include <string>

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/plan/budgets.h"
#include "engine/plan/planner.h"
#include "engine/spec/job_spec.h"

namespace ithaca {

struct ResolvedJob {
  // Concrete: model.dtype, memory.head_chunk, tile_tokens, gpu_budget_gib and host_budget_gib
  // are numbers (CheckResolved passes), and offload / prefetch / recompute_interval /
  // optimizer_offload are the planner's choices when it was free to make them.
  JobSpec spec;
  LlamaConfig config;
  RankBudgets budgets;  // the rank's budgets, with where each came from
  MemoryPlan plan;      // the planner's per-rank peak for `spec`, and whether it fits
  std::string toml;     // JobSpecToToml(spec)
};

// Validates `spec` against its model (engine/spec/validate.h; INVALID_ARGUMENT naming the key),
// takes the budgets from BudgetsFor(spec, node) and lets the planner choose every "auto" setting
// (engine/plan PlanJob). A job that does not fit is still resolved, to the most frugal settings
// tried, so its plan can be shown: plan.fits says so, and RequireFits turns it into the error a
// job about to run returns.
// `limits` bound the planning (engine/plan/meta.h): DEADLINE_EXCEEDED or CANCELLED naming the
// job's length and model.
absl::StatusOr<ResolvedJob> ResolveJob(const JobSpec& spec, const NodeResources& node,
                                       const PlanLimits& limits = {});

// FAILED_PRECONDITION with the plan's verdict when the job does not fit its budgets.
absl::Status RequireFits(const ResolvedJob& job);

// One line for logs: "memory plan: head_chunk 4, tile_tokens 2048, offload off, prefetch on,
// recompute_interval 1, overlap on, optimizer_offload off, param_offload off, dtype bf16, peak
// 61.20 GiB per rank (GPU budget 137.00 GiB), host 0.00 MiB per rank (budget 100.00 GiB)".
std::string ResolutionLine(const ResolvedJob& job);

}  // namespace ithaca
