// ithaca-worker's exit codes: the daemon tells failures apart by them.
#pragma once

#include "engine/core/status.h"

namespace ithaca {

enum WorkerExit : int {
  kExitOk = 0,
  kExitError = 1,        // anything else (I/O, internal)
  kExitBadSpec = 2,      // the job spec, config, weights or data are invalid
  kExitOutOfMemory = 3,  // an allocation failed (the plan did not fit)
  kExitNanLoss = 4,      // the loss became NaN or infinite
  kExitKilled = 5,       // stopped by SIGTERM / cancel
  kExitDrained = 6,      // SIGUSR1 (ithacad --drain-on-exit): checkpointed, then stopped
};

// Maps a status to the exit code that describes it.
inline int ExitCodeFor(const absl::Status& st) {
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
      return st.message().find("loss is") != absl::string_view::npos ? kExitNanLoss : kExitBadSpec;
    case absl::StatusCode::kCancelled:
      return kExitKilled;
    default:
      return kExitError;
  }
}

}  // namespace ithaca
