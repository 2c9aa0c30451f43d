#include "launch/exit_codes.h"

#include <string.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ithaca {
namespace {

// What each exit code means. A code not in the table reads as kExitError's row.
struct ExitMeaning {
  int code;
  const char* reason;       // the metric label (ithaca_worker_exits_total{reason=...})
  const char* description;  // in "exited with code N (description)"
  bool retryable;
};

constexpr ExitMeaning kWorkerExits[] = {
    {kExitOk, "ok", "ok", false},
    {kExitError, "error", "error", true},
    {kExitBadSpec, "bad_spec", "bad job spec", false},
    {kExitOutOfMemory, "oom", "out of memory", false},
    {kExitNanLoss, "nan_loss", "NaN loss", false},
    {kExitKilled, "killed", "stopped by SIGTERM", true},
    {kExitDrained, "drained", "checkpointed and stopped: drained", true},
    {kExitCouldNotStart, "error", "could not start", true},
};

const ExitMeaning& MeaningOf(int code) {
  for (const ExitMeaning& m : kWorkerExits) {
    if (m.code == code) return m;
  }
  return kWorkerExits[1];  // kExitError
}

}  // namespace

int ExitCodeFor(const absl::Status& st) {
  switch (st.code()) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return kExitBadSpec;
    case absl::StatusCode::kResourceExhausted:
      return kExitOutOfMemory;
    case absl::StatusCode::kDataLoss:
      return IsNonFiniteLoss(st) ? kExitNanLoss : kExitBadSpec;
    case absl::StatusCode::kCancelled:
      return kExitKilled;
    default:
      return kExitError;
  }
}

std::string WorkerEnd::Reason() const { return signaled ? "signal" : MeaningOf(code).reason; }

std::string WorkerEnd::Describe() const {
  if (signaled) return absl::StrCat("killed by ", SignalName(code), " (signal ", code, ")");
  return absl::StrCat("exited with code ", code, " (", MeaningOf(code).description, ")");
}

bool WorkerEnd::Retryable() const { return signaled || MeaningOf(code).retryable; }

std::vector<std::string> WorkerExitReasons() {
  std::vector<std::string> out;
  for (const ExitMeaning& m : kWorkerExits) {
    if (std::find(out.begin(), out.end(), m.reason) == out.end()) out.push_back(m.reason);
  }
  out.push_back("signal");
  return out;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", sig);
}

}  // namespace ithaca
