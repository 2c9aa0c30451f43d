// Slurm as ithacad's cluster (`ithacad --cluster slurm`): a job is one `sbatch` of one task per
// node, each running the per-node launcher (`ithaca-worker --daemon ADDR --job ID --nproc N
// --nnodes M --node-rank $SLURM_NODEID --rendezvous tcp:<node 0>:PORT`, worker/local_launch.h,
// its command line from launch/worker_command.h), whose ranks report to ithacad's
// WorkerService over TCP. This file is the one place that speaks to Slurm: it writes the batch
// script, runs sbatch / scancel, and reads a job's state back from squeue (sacct once squeue has
// forgotten it). The supervisor (supervisor.h) decides what Slurm's states mean for the job.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "engine/core/status.h"

namespace ithaca {

// ithacad's --slurm-* flags: the defaults a job's [slurm] keys override.
struct SlurmDefaults {
  std::string partition;
  std::string account;
  std::string time_limit;
  std::string constraint;
  // `#SBATCH --signal=USR1@GRACE`: Slurm's warning this many seconds before the time limit, and
  // on preemption (with SlurmctldParameters=preempt_send_user_signal), on which the ranks
  // checkpoint and stop, and the job is queued again (docs/jobs.md); 0: no warning.
  int signal_grace_s = 120;
  absl::Duration command_timeout = absl::Seconds(30);  // one sbatch / squeue / scancel call
};

// One job's submission.
struct SlurmSubmission {
  std::string job_id;          // ithacad's id ("job-3"): the Slurm job is named ithaca-<id>
  std::string log_dir;         // the script, Slurm's output and the rank logs go here
  std::string worker_binary;   // ithaca-worker, at this path on every node
  std::string daemon_address;  // host:port of the WorkerService the ranks dial
  int nodes = 1;
  int ranks_per_node = 1;
  bool gpus = false;  // --gpus-per-node=ranks_per_node
  // The job's [slurm] keys; empty ones fall back to SlurmDefaults.
  std::string partition, account, time_limit, constraint;
  int signal_grace_s = 0;  // [slurm] signal_grace; 0: SlurmDefaults::signal_grace_s
  // Added to sbatch's environment, which the job's tasks inherit (--export=ALL): the job id and
  // secret, the daemon's token and CA files.
  std::vector<std::pair<std::string, std::string>> env;
};

// What Slurm says of a job.
struct SlurmJobState {
  bool known = false;     // false: neither squeue nor sacct knows the job id
  std::string state;      // PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT,
                          // NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE, OUT_OF_MEMORY, ...
  std::string reason;     // squeue's %r: "None", "Resources", "ReqNodeNotAvail, ...", ...
  std::string nodes;      // its node list, "n[1-2]"
  bool Active() const;    // still queued or running (PENDING, RUNNING, COMPLETING, ...)
  bool Terminal() const;  // known and not active
  std::string ToString() const;  // "CANCELLED (reason None) on n[1-2]"
};

// The batch script for `s` (what Submit writes to <log_dir>/slurm.sbatch).
std::string SlurmBatchScript(const SlurmSubmission& s, const SlurmDefaults& d);

// Writes the script and runs `sbatch --parsable` on it; returns the Slurm job id.
// UNAVAILABLE naming sbatch and what it printed when the submission fails.
absl::StatusOr<std::string> SlurmSubmit(const SlurmSubmission& s, const SlurmDefaults& d);

// `scancel ID` (signal 0: cancel the job), or `scancel --signal=SIG ID`: SIG to every process
// of the job's steps (the launchers and their ranks), as Slurm's own --signal warning does.
absl::Status SlurmCancel(const std::string& slurm_id, int signal, const SlurmDefaults& d);

// Why Slurm sent a job its warning signal (`--signal`), asked once the job has stopped on it:
// "PREEMPTED at 2026-12-02T04:32:02" when Slurm preempted it (squeue's PreemptTime); "TIMEOUT
// (used 9:01 of its 10:00)" when its time limit was within `grace` (+ a minute of Slurm's
// checking period) of its run time; otherwise a user's `scancel --signal=USR1`. UNAVAILABLE when
// squeue cannot say (it forgot the job: accounting does not keep PreemptTime).
absl::StatusOr<std::string> SlurmWarningCause(const std::string& slurm_id, int grace_s,
                                              const SlurmDefaults& d);
// "10:00", "1-02:03:04", "UNLIMITED": seconds; -1 for what is not a duration.
int64_t SlurmDurationSeconds(const std::string& text);

// squeue (every state Slurm still remembers), else sacct. UNAVAILABLE when Slurm cannot be asked.
absl::StatusOr<SlurmJobState> SlurmQuery(const std::string& slurm_id, const SlurmDefaults& d);

// What the cluster has, for `ithaca node` (sinfo over --slurm-partition, else every partition; a
// node in several partitions counts once).
struct SlurmClusterState {
  int nodes = 0;
  int idle = 0;         // idle
  int busy = 0;         // allocated, mixed, completing
  int unavailable = 0;  // down, drained, draining, failing, not responding ("*"), ...
};
absl::StatusOr<SlurmClusterState> QuerySlurmCluster(const SlurmDefaults& d);
// One node's state as sinfo's %T prints it ("idle", "mixed-", "down*") counted into `s`.
void CountSlurmNodeState(const std::string& state, SlurmClusterState* s);

// The lines of the job's batch output (<log_dir>/slurm-<id>.out) that say why it ended: srun's
// errors and slurmstepd's "*** ... CANCELLED ... ***"; at most `max_lines`, newest last, joined
// by "; ".
std::string SlurmOutputErrors(const std::string& log_dir, const std::string& slurm_id,
                              int max_lines = 3);

// Runs argv (looked up in PATH) with `env` added, stdin from /dev/null, and returns its exit
// code and what it wrote (stdout and stderr); DEADLINE_EXCEEDED (the process is killed) after
// `timeout`; NOT_FOUND when the program cannot be run.
struct CommandResult {
  int exit_code = 0;
  std::string out;
  std::string err;
};
absl::StatusOr<CommandResult> RunCommand(
    const std::vector<std::string>& argv,
    const std::vector<std::pair<std::string, std::string>>& env, absl::Duration timeout);

}  // namespace ithaca
