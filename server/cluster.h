// Where a job's ranks run, behind one interface: this node's processes (LocalCluster,
// local_cluster.h) or a Slurm allocation (SlurmCluster, slurm_cluster.h; ithacad --cluster
// slurm). The Supervisor (supervisor.h) keeps each job's life cycle: registration, heartbeats,
// reports, judging the ranks' ends, the outcome and what its owner is told. A Cluster starts the
// ranks, says how each one ended, stops them, and adds what the cluster itself knows: Slurm's
// state of the job, which can decide it (a job Slurm cancelled, timed out or lost a node of).
//
// Every call comes with the supervisor's lock held (Poll may let it go while it asks the
// cluster), from the supervisor's thread or a WorkerService call.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "engine/core/mutex.h"
#include "engine/core/status.h"
#include "launch/exit_codes.h"
#include "server/adoption.h"
#include "server/job_state.h"
#include "server/log_files.h"

namespace ithaca {

// A job the scheduler gave slots to, ready to launch.
struct LaunchOrder {
  std::string job_id;
  std::string spec_toml;   // what every rank receives at Register
  std::string log_dir;     // rank logs and the rendezvous directory go here
  std::vector<int> slots;  // slots[rank]
};

// A job whose workers a previous daemon launched and which still run (Jobs::Recover checks).
struct AdoptOrder {
  std::string job_id;
  std::string spec_toml;
  std::string log_dir;
  AdoptionRecord record;
  bool running = false;  // the job was RUNNING (every rank had registered), not STARTING
  // last_steps[rank]: the newest step the store holds of each rank (0: none). A rank re-sends
  // the report that was in flight when its daemon went away; one already recorded is ignored.
  std::vector<int64_t> last_steps;
  // Set: the job runs under Slurm as this job id (ithacad --cluster slurm); its ranks re-attach
  // over TCP and the record's pids are not used.
  std::string slurm_id;
};

// One rank of a supervised job.
struct SupervisedRank {
  int pid = 0;
  int slot = 0;
  bool registered = false;
  absl::Time last_heartbeat;
  std::optional<WorkerEnd> exit;
  // Adopted from a previous daemon: not our child, so no waitpid; its end is what it announced
  // (Exiting: its exit code, or the signal its node's launcher saw kill it), or unknown when it
  // vanished without a word.
  bool adopted = false;
  std::optional<WorkerEnd> announced_exit;
  bool vanished = false;
  std::string last_error;  // newest ERROR line the worker sent
  int64_t last_step = 0;   // newest step report recorded (a re-sent one is not recorded twice)
  std::unique_ptr<LogTail> log;
  // On another node (a Slurm job): no pid of ours until it registers, no /proc to look at.
  bool remote = false;
  std::string node;  // where it registered from
};

// What a cluster keeps of a job beyond the supervisor's fields (its process group, Slurm's
// job id and state).
struct ClusterJobState {
  virtual ~ClusterJobState() = default;
};

// A job the supervisor runs, from its launch (or adoption) until its outcome is reported.
struct SupervisedJob {
  std::string id;
  std::string spec_toml;
  bool cuda = false;  // the spec's backend is "cuda": its ranks run on GPUs (metrics labels)
  std::string rendezvous;
  std::string log_dir;
  std::string secret;  // every rank's ITHACA_JOB_SECRET
  // Step reports the store could not take (a full state disk): (rank, step), until the rank
  // sends them again and they are stored; what is left when the job ends is named in its
  // reason, so the history's gap is said, not silent.
  std::set<std::pair<int, int64_t>> unstored_steps;
  std::string unstored_error;
  std::vector<SupervisedRank> ranks;
  absl::Time launched;   // the ranks' start timeout counts from here
  bool running = false;  // every rank registered
  // Once the outcome is decided the job is "ending": its workers are being stopped.
  bool ending = false;
  JobState outcome = v1::JOB_STATE_UNSPECIFIED;
  std::string reason;
  std::optional<int> failed_rank;
  bool retryable = false;  // see JobOwner::OnEnded
  bool draining = false;   // Drain asked it to checkpoint and stop
  absl::Time kill_deadline;
  bool killed = false;  // nothing more to send: SIGKILL sent, or the cluster stops it itself
  std::unique_ptr<ClusterJobState> cluster;
};

using SupervisedJobs = std::map<std::string, std::unique_ptr<SupervisedJob>>;

// The cluster's own decision on a job, before (or instead of) its ranks' ends.
struct ClusterVerdict {
  JobState outcome = v1::JOB_STATE_FAILED;
  std::string reason;
  bool retryable = false;
  // CANCELLED: the owner hears CANCELLING first (a cancel the cluster made, not the user).
  bool cancelling_first = false;
};

class Cluster {
 public:
  virtual ~Cluster() = default;

  // What a launch tells the job's owner.
  struct Launched {
    std::string reason;       // for the history: "launched 2 workers on GPUs 0,1"
    std::string cluster_job;  // "slurm:ID", kept for a daemon restart; "" for local processes
    int pgid = 0;             // the ranks' process group on this node (0: not here)
  };
  // Starts the ranks of `order` into `job` (its ranks, secret, rendezvous, launch time);
  // an error says why the launch failed.
  virtual absl::StatusOr<Launched> Launch(const LaunchOrder& order, SupervisedJob& job) = 0;
  // Takes over the ranks a previous daemon launched (job.ranks are made from the record).
  virtual void Adopt(const AdoptOrder& order, SupervisedJob& job) = 0;

  // Asks the cluster about its jobs that are due a look; may let `mu` go meanwhile, and returns
  // how long it did (the supervisor does not blame its ranks for that time).
  virtual absl::Duration Poll(Mutex& mu, SupervisedJobs& jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return absl::ZeroDuration();
  }
  // How `rank` ended, if it has since the last look.
  virtual std::optional<WorkerEnd> RankEnd(const SupervisedJob& job, SupervisedRank& rank,
                                           absl::Time now) = 0;
  // A rank stopped drained (checkpointed on SIGUSR1) without Drain asking: true when the
  // cluster sent the signal (Slurm's warning before a time limit or preemption), so the drain
  // is not a failure.
  virtual bool DrainedByCluster(SupervisedJob& job) { return false; }

  enum class Judgement {
    kRanksDecide,  // the ranks' ends decide (the culprit may have been changed or withheld)
    kWait,         // nothing decides the job in this look
    kDecided,      // the verdict ends the job
  };
  // Before the ranks' ends decide a job that is not ending: the cluster's word. `culprit` is
  // the rank whose end would fail the job; the cluster may withhold it while its own state may
  // still say why, or name another.
  virtual Judgement Judge(SupervisedJob& job, std::optional<size_t>* culprit, absl::Time now,
                          ClusterVerdict* verdict) {
    return Judgement::kRanksDecide;
  }
  // Whether the job is over once all its ranks ended (false: the cluster's word finishes it).
  virtual bool RanksEndTheJob() const { return true; }
  // Whether the ranks' start timeout runs (false while the cluster keeps the job pending).
  virtual bool Started(const SupervisedJob& job) const { return true; }
  // The cluster queues and places jobs itself (Slurm): the jobs it holds are counted as queued.
  virtual bool Schedules() const { return false; }

  // Stops the job's ranks after its outcome was decided: now (SIGKILL), or politely with
  // job.kill_deadline set for Kill.
  virtual void Stop(SupervisedJob& job, JobState outcome, bool now) = 0;
  // The grace period is over, or the job is finalized: kills whatever of it is left here.
  virtual void Kill(SupervisedJob& job) = 0;
  // Asks the ranks to checkpoint and stop (SIGUSR1, as Drain does); an error: not asked.
  virtual absl::Status Drain(SupervisedJob& job) = 0;

  // What the cluster says of the job, for reasons ("Slurm job 12 FAILED (...) on n[1-2]"), or ""
  // when it has nothing to add.
  virtual std::string Says(const SupervisedJob& job) const { return ""; }
  // Why a rank that vanished without a word is gone.
  virtual std::string VanishedReason(const SupervisedJob& job, size_t rank) const = 0;
  // Where the job runs, for its RUNNING transition (" (Slurm job 12: ranks 0-1 on n1)"), or "".
  virtual std::string RunningWhere(const SupervisedJob& job) const { return ""; }
};

}  // namespace ithaca
