// Supervisor: runs jobs' worker processes and talks to them. From its own long-lived thread it
// launches the jobs its owner hands it (through its Cluster, below) and judges their workers: a
// worker that exits non-zero, stops heart-beating or never registers fails the job naming the
// rank, and the job's other workers are stopped; cancel asks them to stop (SIGTERM, then SIGKILL
// after the grace period, or scancel under Slurm). A job's
// outcome is reported only once all its workers are gone. The WorkerService (Register,
// ReportStep, Heartbeat, Log, Exiting) is answered here.
//
// Workers outlive the daemon: they run in their own process group without a death signal, and
// every launch writes an adoption record (adoption.h). A daemon that stops (Detach) leaves its
// jobs running; the next one, on the same state directory, adopts their workers (Adopt) before it
// starts, and they re-attach with the job's secret. An adopted worker is not this daemon's child:
// it is judged alive through /proc, and its exit code is the one it announced (Exiting).
//
// Where the ranks run is its Cluster's (cluster.h): this node's processes (LocalCluster) or,
// under `ithacad --cluster slurm` (Options::slurm), a Slurm batch job (SlurmCluster), whose
// state can decide a job the ranks' ends cannot. The cluster launches, watches and stops; the
// supervisor keeps the life cycle.
//
// A worker's silence is judged only over time the supervisor was listening: a pass that comes
// late (its lock held through a slow store write, a daemon without CPU) moves the heartbeat and
// start clocks on by the delay (ForgiveStallLocked).
//
// The supervisor knows nothing of the job store, the queue or the event logs: those belong to its
// owner (Jobs, jobs.h), which hands it jobs to launch and hears about everything that happens to
// them through JobOwner.
#pragma once

#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/core/mutex.h"
#include "absl/time/time.h"
#include "ithaca/v1/job.pb.h"
#include "ithaca/v1/worker.pb.h"
#include "server/adoption.h"
#include "server/cluster.h"
#include "server/job_state.h"
#include "launch/launcher.h"
#include "server/log_files.h"
#include "server/metrics.h"
#include "server/node.h"
#include "server/slurm.h"

namespace ithaca {

// The owner of the jobs a Supervisor runs. The supervisor calls it with its own lock held, so one
// job's reports arrive in the order they happened and a cancel cannot slip between a launch and
// its report; an implementation must therefore never call back into the Supervisor.
class JobOwner {
 public:
  virtual ~JobOwner() = default;

  // The jobs to launch now, each already holding its slots. Called from the supervisor's thread.
  virtual std::vector<LaunchOrder> TakeLaunches() = 0;
  // The job's workers were started in process group `pgid`; `reason` says where.
  virtual void OnLaunched(const std::string& job_id, const std::vector<int>& slots, int pgid,
                          const std::string& reason) = 0;
  // The cluster took the job (before OnLaunched): "slurm:ID", kept for a daemon restart.
  virtual void OnClusterJob(const std::string& job_id, const std::string& cluster_job) {}
  // RUNNING (every rank registered) or CANCELLING (a cancel is stopping the workers); returns the
  // job as recorded. An error (the change is not allowed) is returned to whoever caused it, and
  // the supervisor goes no further with that change.
  virtual absl::StatusOr<v1::Job> OnStateChange(const std::string& job_id, JobState to,
                                                const std::string& reason) = 0;
  // A rank's step report; an error goes back to the worker.
  virtual absl::Status OnStep(const std::string& job_id, const v1::StepReport& step) = 0;
  // An evaluation's report (rank 0's, for the whole job); an error goes back to the worker.
  virtual absl::Status OnEval(const std::string& job_id, const v1::EvalReport& eval) = 0;
  // Lines a rank wrote to its log since the last call.
  virtual void OnLogLines(const std::string& job_id, int rank, std::vector<std::string> lines) = 0;
  // The job is over: every worker is gone, or none could be started. Its slots are free again.
  // `retryable`: a FAILED job whose failure need not repeat (a rank killed, crashed or silent;
  // not a bad spec, a NaN loss or out of memory), which its retry policy may queue again.
  virtual void OnEnded(const std::string& job_id, JobState outcome, const std::string& reason,
                       std::optional<int> failed_rank, bool retryable) = 0;
};

class Supervisor {
 public:
  struct Options {
    std::string worker_binary;  // ithaca-worker
    std::string worker_socket;  // the WorkerService unix socket the workers dial
    absl::Duration heartbeat_timeout = absl::Seconds(30);
    absl::Duration start_timeout = absl::Seconds(120);  // launch → every rank registered
    absl::Duration grace_period = absl::Seconds(10);    // SIGTERM → SIGKILL on cancel
    int heartbeat_interval_ms = 1000;                   // told to workers at Register
    // Told to workers at Register: how long they train on without a daemon (one restarting),
    // waiting to re-attach, before they give up.
    absl::Duration daemon_lost_timeout = absl::Minutes(5);
    absl::Duration poll_interval = absl::Milliseconds(50);
    // Set (ithacad --worker-user): workers run as this user, and each launch's rendezvous
    // directory is theirs.
    std::optional<RunAs> run_as;
    // Set (ithacad --cluster slurm): jobs are submitted to Slurm with these defaults instead of
    // forked here. Their ranks dial worker_address (host:port of the WorkerService on the
    // client port), with the clients' token file and CA, which must be readable at the same
    // paths on the nodes (a shared file system, like the job's data and checkpoints).
    std::optional<SlurmDefaults> slurm;
    std::string worker_address;
    std::string worker_token_file;                            // the ranks' ITHACA_TOKEN_FILE
    std::string worker_ca_file;                               // the ranks' ITHACA_CA
    absl::Duration cluster_poll_interval = absl::Seconds(1);  // squeue, per job
    // A rank ending with SIGTERM's code while Slurm's job still runs waits this long for Slurm's
    // state (scancel, a time limit and preemption all begin with SIGTERM).
    absl::Duration cluster_verdict_wait = absl::Seconds(20);
  };

  // `node` maps a rank's slot to its device (metrics labels, CPU or GPU workers).
  Supervisor(Options options, Node node, JobOwner* owner, Metrics* metrics);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts the supervision thread; every launch happens on it.
  void Start();
  // Takes over the workers of a job launched by a previous daemon; before Start. They have
  // start_timeout to re-attach, as a launch's workers have to register.
  void Adopt(const AdoptOrder& order);
  // Stops every running job (FAILED, `reason`), waits for its workers, stops the thread; nothing
  // is launched from now on.
  void Shutdown(const std::string& reason);
  // Asks the running jobs in `job_ids` to checkpoint and stop (SIGUSR1: the ranks agree on the
  // step, write a checkpoint together and exit with kExitDrained; a Slurm job's through
  // `scancel --signal=USR1`, the way Slurm's own warning comes); each is reported QUEUED
  // ("drained ...") once its workers are gone. Waits up to `timeout` for them; returns how many
  // were drained. Jobs still running then are left to Detach (or go on).
  // `cancelled`, looked at every 100 ms, ends the wait early (the drain stays asked).
  int Drain(const std::vector<std::string>& job_ids, absl::Duration timeout,
            const std::function<bool()>& cancelled = {});
  // Stops the thread and leaves every running job's workers alone (a daemon restart or upgrade):
  // the next daemon adopts them. Nothing is launched from now on; returns how many jobs were left
  // running.
  int Detach();
  // Wakes the thread, so a job just queued launches without waiting for the next poll.
  void Wake();

  // Begins stopping a job's workers: SIGTERM now, SIGKILL after the grace period; the job goes
  // CANCELLING now (returned, as the owner recorded it) and CANCELLED once they are gone. nullopt
  // when the job was already ending: its outcome stands. NOT_FOUND when no workers of the job
  // run here.
  absl::StatusOr<std::optional<v1::Job>> Cancel(const std::string& job_id,
                                                const std::string& reason);
  int running_jobs();
  // Under Slurm: this daemon's jobs that Slurm runs, and those it holds PENDING (or has not
  // been asked about yet).
  struct ClusterJobs {
    int running = 0;
    int pending = 0;
  };
  ClusterJobs cluster_jobs();

  // Kills the processes of `pgid` that are workers of `job_id`, left by a daemon that died;
  // returns how many. The environment check keeps a reused process-group id from hitting
  // anything else.
  static int KillStrayWorkers(int pgid, const std::string& job_id);

  // WorkerService.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  absl::Status ReportStep(const v1::ReportStepRequest& request);
  absl::Status ReportEval(const v1::ReportEvalRequest& request);
  absl::Status Heartbeat(const v1::HeartbeatRequest& request);
  absl::Status Log(const v1::LogRequest& request);
  absl::Status Exiting(const v1::ExitingRequest& request);
  // Over TCP every call must carry its job's secret (launch/worker_contract.h): PERMISSION_DENIED
  // otherwise, NOT_FOUND for a job that has no workers here.
  absl::Status CheckSecret(const std::string& job_id, const std::string& secret);

 private:
  void Loop();
  void LaunchLocked(const LaunchOrder& order) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pass that comes more than kStallForgiven late moves every rank's heartbeat and start
  // clocks on by the delay: a daemon that could not listen does not blame its ranks.
  static constexpr absl::Duration kStallForgiven = absl::Milliseconds(500);
  void ForgiveStallLocked(absl::Time now, absl::Duration since_last_pass)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SuperviseLocked(SupervisedJob& job, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLocked(SupervisedJob& job, JobState outcome, const std::string& reason,
                 std::optional<int> failed_rank, bool sigkill_now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinalizeLocked(SupervisedJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TailLogsLocked(SupervisedJob& job, bool flush) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How /metrics labels a rank: its GPU's index and UUID, or Metrics::kCpuSlot on a CPU slot.
  std::pair<int, std::string> MetricsDevice(const SupervisedJob& a, const SupervisedRank& r) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<SupervisedJob*> ActiveLocked(const std::string& job_id, int rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  const Node node_;
  JobOwner* const owner_;
  Metrics* const metrics_;
  // Where the ranks run: LocalCluster, or SlurmCluster under Options::slurm.
  const std::unique_ptr<Cluster> cluster_;

  Mutex mu_;
  CondVar wake_;  // signalled (with mu_) when the loop should look, or a job has ended
  SupervisedJobs active_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Stopped by Detach: the workers are the next daemon's.
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ithaca
