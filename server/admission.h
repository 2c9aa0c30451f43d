// Admission: what ithacad checks before it queues a job, so a bad job fails at submit with the
// key that is wrong (INVALID_ARGUMENT) or the numbers that do not fit (FAILED_PRECONDITION),
// never later on a worker.
//
// Memory: the engine's planner (engine/plan) predicts every tier's per-rank peak by replaying one
// step of the real schedule, resolves "auto" settings, and the job is admitted only if the peak
// fits the node's budget (GPU memory; for CPU jobs the host's memory shared by the ranks).
#pragma once

#include <string>

#include "engine/core/status.h"
#include "engine/model/config.h"
#include "engine/train/job_spec.h"
#include "ithaca/v1/job.pb.h"
#include "server/node.h"

namespace ithaca {

struct AdmittedSpec {
  JobSpec spec;  // paths absolute
  LlamaConfig config;
  std::string toml;  // canonical (JobSpecToToml of `spec`): what the workers receive
  v1::JobSpecSummary summary;
};

// Parses and validates a submitted spec. INVALID_ARGUMENT naming the key for anything wrong in
// the spec itself (unknown key, bad value, heads not divisible by sp, missing data file).
absl::StatusOr<AdmittedSpec> ParseSubmission(const std::string& toml_text,
                                             const std::string& source,
                                             const std::string& base_dir);

// The planner's per-rank peak per tier against the node's budget.
v1::MemoryPlan EstimateMemory(const AdmittedSpec& admitted, const Node& node);

// FAILED_PRECONDITION when the node cannot run the job: backend, world > slots, or the plan does
// not fit (the message carries the plan's numbers).
absl::Status CheckFits(const AdmittedSpec& admitted, const Node& node);

}  // namespace ithaca
