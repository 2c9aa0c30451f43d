// Job states (docs/architecture.md): QUEUED → STARTING → RUNNING → {SUCCEEDED, FAILED,
// CANCELLING → CANCELLED}. The enum is the proto's; these helpers are the rules.
#pragma once

#include <string>

#include "ithaca/v1/job.pb.h"

namespace ithaca {

using v1::JobState;

// "QUEUED", "RUNNING", ... (the proto name without its JOB_STATE_ prefix).
std::string JobStateName(JobState s);
// Lower-case label for metrics and the CLI: "queued", "running", ...
std::string JobStateLabel(JobState s);
bool IsTerminal(JobState s);
// Whether `from` → `to` is a transition the state machine allows.
bool IsAllowedTransition(JobState from, JobState to);

}  // namespace ithaca
