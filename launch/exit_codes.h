// ithaca-worker's exit codes, and what each means to the daemon and the launcher: one table
// (kWorkerExits in exit_codes.cc) gives each code its metric label, its description and whether
// another attempt of the job could end otherwise. The worker picks its code from the status it
// ends with (ExitCodeFor); the daemon and the launcher read a rank's end through WorkerEnd.
#pragma once

#include <string>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

enum WorkerExit : int {
  kExitOk = 0,
  kExitError = 1,            // anything else (I/O, internal)
  kExitBadSpec = 2,          // the job spec, config, weights or data are invalid
  kExitOutOfMemory = 3,      // an allocation failed (the plan did not fit)
  kExitNanLoss = 4,          // the loss became NaN or infinite
  kExitKilled = 5,           // stopped by SIGTERM / cancel
  kExitDrained = 6,          // SIGUSR1 (ithacad --drain-on-exit): checkpointed, then stopped
  kExitCouldNotStart = 127,  // the shell's and execvp's code: the worker binary did not run
};

// Maps a status to the exit code that describes it: INVALID_ARGUMENT, NOT_FOUND,
// FAILED_PRECONDITION and DATA_LOSS are a bad spec (bad input), except a non-finite loss
// (IsNonFiniteLoss, engine/core/status.h); RESOURCE_EXHAUSTED is out of memory; CANCELLED is
// killed; anything else an error.
int ExitCodeFor(const absl::Status& st);

// How a worker process ended: an exit code, or the signal that killed it.
struct WorkerEnd {
  bool signaled = false;
  int code = 0;  // exit code, or the signal number when signaled
  bool ok() const { return !signaled && code == kExitOk; }
  // Checkpointed and stopped on SIGUSR1 (a drain).
  bool drained() const { return !signaled && code == kExitDrained; }
  // The code a shell reports for it: the exit code, or 128 + the signal.
  int ShellCode() const { return signaled ? 128 + code : code; }
  // Metric label: "ok", "error", "bad_spec", "oom", "nan_loss", "killed", "drained", "signal".
  std::string Reason() const;
  // "exited with code 4 (NaN loss)", "killed by SIGKILL (signal 9)".
  std::string Describe() const;
  // Whether another attempt could end otherwise: a signal, a crash, an I/O or collective error
  // may not repeat; a bad spec, a NaN loss or running out of memory would fail again the same
  // way, and ok is not a failure.
  bool Retryable() const;
};

// Every label WorkerEnd::Reason can give, each once, in the table's order ("signal" last).
std::vector<std::string> WorkerExitReasons();

// "SIGKILL" for 9 ("signal N" when the platform has no name for it).
std::string SignalName(int sig);

}  // namespace ithaca
