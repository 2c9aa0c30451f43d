#include "server/job_state.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace ithaca {

std::string JobStateName(JobState s) {
  std::string n = v1::JobState_Name(s);
  if (absl::StartsWith(n, "JOB_STATE_")) n = n.substr(10);
  return n.empty() ? "UNKNOWN" : n;
}

std::string JobStateLabel(JobState s) { return absl::AsciiStrToLower(JobStateName(s)); }

bool IsTerminal(JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

bool IsAllowedTransition(JobState from, JobState to) {
  using namespace v1;  // NOLINT: the enum values only
  switch (from) {
    case JOB_STATE_UNSPECIFIED:
      return to == JOB_STATE_QUEUED;
    case JOB_STATE_QUEUED:
      return to == JOB_STATE_STARTING || to == JOB_STATE_CANCELLED || to == JOB_STATE_FAILED;
    // STARTING / RUNNING → QUEUED: requeued to resume from a checkpoint after a daemon restart.
    case JOB_STATE_STARTING:
      return to == JOB_STATE_RUNNING || to == JOB_STATE_FAILED || to == JOB_STATE_CANCELLING ||
             to == JOB_STATE_SUCCEEDED || to == JOB_STATE_QUEUED;
    case JOB_STATE_RUNNING:
      return to == JOB_STATE_SUCCEEDED || to == JOB_STATE_FAILED || to == JOB_STATE_CANCELLING ||
             to == JOB_STATE_QUEUED;
    case JOB_STATE_CANCELLING:
      return to == JOB_STATE_CANCELLED || to == JOB_STATE_FAILED;
    default:
      return false;  // terminal states stay
  }
}

}  // namespace ithaca
