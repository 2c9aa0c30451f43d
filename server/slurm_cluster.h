// The cluster of Slurm (ithacad --cluster slurm): a job goes to Slurm as one batch job of one
// task per node (slurm.h) instead of being forked here. Its ranks register over TCP with the
// job's secret; a rank's end is what it announced (Exiting; a killed rank's node launcher
// announces the signal for it), or, when the Slurm job ended first, Slurm's state (squeue,
// polled every poll_interval without the supervisor's lock). Slurm's state decides what the
// ranks' own ends cannot: a job Slurm cancelled is CANCELLED with Slurm's reason; NODE_FAIL,
// TIMEOUT, PREEMPTED, BOOT_FAIL and DEADLINE fail it as a failure that need not repeat; a job
// Slurm keeps PENDING because a node it needs is down fails after start_timeout; a rank's end
// while Slurm's job still runs waits up to verdict_wait for Slurm's word on why. Before a time
// limit and on preemption Slurm warns the job (`--signal=USR1@grace`): its ranks checkpoint and
// stop as in a drain, and the job is reported QUEUED with Slurm's cause (SlurmWarningCause).
// Cancel and drain are scancel; a restarted daemon adopts a Slurm job that Slurm still runs and
// tells its ranks where it listens now (JobDaemonAddrPath, launch/layout.h, which they read
// before each re-attach).
#pragma once

#include <string>

#include "server/cluster.h"
#include "server/slurm.h"

namespace ithaca {

class SlurmCluster : public Cluster {
 public:
  struct Options {
    SlurmDefaults slurm;
    std::string worker_binary;  // ithaca-worker, at this path on every node
    // The ranks dial worker_address (host:port of the WorkerService on the client port), with
    // the clients' token file and CA, which must be readable at the same paths on the nodes.
    std::string worker_address;
    std::string worker_token_file;
    std::string worker_ca_file;
    bool gpus = false;                                // --gpus-per-node
    absl::Duration poll_interval = absl::Seconds(1);  // squeue, per job
    // A rank ending while Slurm's job still runs waits this long for Slurm's state (scancel, a
    // time limit and preemption all begin with SIGTERM).
    absl::Duration verdict_wait = absl::Seconds(20);
    absl::Duration start_timeout = absl::Seconds(120);  // a PENDING job waiting for a down node
    absl::Duration grace_period = absl::Seconds(10);    // Slurm's KillWait is on top of it
  };
  explicit SlurmCluster(Options options) : options_(std::move(options)) {}

  absl::StatusOr<Launched> Launch(const LaunchOrder& order, SupervisedJob& job) override;
  void Adopt(const AdoptOrder& order, SupervisedJob& job) override;
  absl::Duration Poll(Mutex& mu, SupervisedJobs& jobs) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::optional<WorkerEnd> RankEnd(const SupervisedJob& job, SupervisedRank& rank,
                                   absl::Time now) override;
  bool DrainedByCluster(SupervisedJob& job) override;
  Judgement Judge(SupervisedJob& job, std::optional<size_t>* culprit, absl::Time now,
                  ClusterVerdict* verdict) override;
  bool RanksEndTheJob() const override { return false; }
  bool Started(const SupervisedJob& job) const override;
  bool Schedules() const override { return true; }
  void Stop(SupervisedJob& job, JobState outcome, bool now) override;
  void Kill(SupervisedJob& job) override;
  absl::Status Drain(SupervisedJob& job) override;
  std::string Says(const SupervisedJob& job) const override;
  std::string VanishedReason(const SupervisedJob& job, size_t rank) const override;
  std::string RunningWhere(const SupervisedJob& job) const override;

 private:
  // A job whose ranks all stopped drained (Drain, or Slurm's warning signal): once Slurm's
  // job has ended (or verdict_wait passed), ends it QUEUED with the cause; kWait until then.
  Judgement DrainedJudgement(SupervisedJob& job, absl::Time now, ClusterVerdict* verdict);
  // A job Slurm itself ended (CANCELLED, TIMEOUT, NODE_FAIL, ...) or keeps PENDING for a node
  // that is down: the verdict, with Slurm's reason.
  std::optional<ClusterVerdict> SlurmVerdict(const SupervisedJob& job, absl::Time now) const;

  const Options options_;
};

}  // namespace ithaca
