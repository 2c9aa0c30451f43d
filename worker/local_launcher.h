// Local launcher (like torchrun, for one machine): runs N copies of a command as ranks 0..N-1,
// each with ITHACA_RANK / ITHACA_WORLD_SIZE / ITHACA_RENDEZVOUS / ITHACA_GPU set, and supervises
// them: the first rank to fail stops the others (SIGTERM, then SIGKILL after a grace period),
// SIGINT / SIGTERM sent to the launcher are forwarded, and no child outlives the launcher (they
// get SIGKILL if it dies: PR_SET_PDEATHSIG, which fires when the *thread* that called
// LaunchLocal exits, so call it from a thread that lives as long as the launch).
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/core/status.h"

namespace ithaca {

struct LaunchOptions {
  // The command each rank runs: argv[0] is a path, or a name looked up in PATH.
  std::vector<std::string> argv;
  int nproc = 1;
  // Rank r gets ITHACA_GPU = gpus[r]; empty: ITHACA_GPU = r.
  std::vector<int> gpus;
  // Extra environment for every rank (on top of the launcher's own).
  std::vector<std::pair<std::string, std::string>> env;
  // Rank 0 writes to out_fd / err_fd directly. Other ranks' lines go there too, prefixed
  // "[rank r] ", unless log_dir is set: then to log_dir/rank_<r>.log (stdout and stderr).
  int out_fd = 1;
  int err_fd = 2;
  std::string log_dir;
  // After a failure or a forwarded signal, how long ranks get to exit before SIGKILL.
  double grace_period_s = 10;
  // Parent of the rendezvous directory the launcher creates (and removes afterwards);
  // empty: $TMPDIR, else /tmp.
  std::string temp_dir;
  // Install handlers for the launch (restored afterwards): SIGINT / SIGTERM are forwarded to
  // the ranks, and SIGCHLD wakes the launcher so that the rank failing first is reaped first.
  // Only one launch per process may do this at a time. Without them, exits are polled.
  bool forward_signals = true;
};

struct RankExit {
  int rank = 0;
  pid_t pid = 0;
  bool exited = false;  // else killed by `signal`
  int exit_code = 0;
  int signal = 0;
  bool stopped_by_launcher = false;  // it was sent SIGTERM/SIGKILL because of another's failure
  std::string ToString() const;      // "rank 2 exited with code 3", "rank 1 killed by SIGKILL"
};

struct LaunchReport {
  std::vector<RankExit> ranks;
  int first_failure = -1;    // the rank that failed first; -1 if none did
  int forwarded_signal = 0;  // SIGINT / SIGTERM the launcher received, 0 if none
  // The exit code a launcher process should end with: the first failing rank's code (128 +
  // signal if it was killed), 128 + the forwarded signal, or 0.
  int ExitCode() const;
};

// Runs the ranks and waits for all of them. OK when every rank exits 0. Otherwise: ABORTED
// naming the first failing rank and its exit code or signal, CANCELLED when a forwarded signal
// stopped the run, INVALID_ARGUMENT for bad options, INTERNAL if the launcher itself cannot
// proceed (fork, pipes). `report` (optional) receives every rank's exit.
absl::Status LaunchLocal(const LaunchOptions& options, LaunchReport* report = nullptr);

}  // namespace ithaca
