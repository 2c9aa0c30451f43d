// Jobs: the daemon's job service, behind the thin JobService gRPC handlers (services.cc). It
// admits jobs (admission.h), stores them (job_store.h), queues them (scheduler.h) and keeps each
// job's event stream (event_log.h); its Supervisor (supervisor.h) runs the jobs' workers and
// reports back through the JobOwner interface, which Jobs implements privately. After a restart,
// jobs whose workers still run are adopted (server/adoption.h): they go on where they are. Jobs
// that were running and whose workers are gone are marked FAILED ("daemon restarted"), or queued
// again when they can resume from a checkpoint; queued jobs are queued again.
//
// Jobs, not the supervisor, owns the scheduler: the queue is made of stored jobs that have no
// processes yet (submit adds, cancel removes, recovery re-queues, GetNode reports), and the
// supervisor only sees a job from its launch on. A job's slots are freed when the supervisor
// reports its outcome (OnEnded).
//
// Jobs owns the event logs too: a job's stream spans its whole life, from queued to ended (and is
// replayed for jobs that ended before this daemon started), and its state events must follow the
// order in which the store records the transitions, which only the owner of the store can keep.
// The supervisor forwards step reports and log lines into it.
//
// Locking: the supervisor calls JobOwner with its own lock held and Jobs then takes its lock, so
// Jobs never calls the Supervisor while holding its lock.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "engine/core/mutex.h"
#include "absl/time/time.h"
#include "ithaca/v1/job.pb.h"
#include "server/admission.h"
#include "server/event_log.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/node.h"
#include "server/scheduler.h"
#include "server/supervisor.h"

namespace ithaca {

// Why a job waiting for `parent` (submit --after) is cancelled when `parent` ended `outcome`
// with `reason`: "job P it waited for (--after) ended cancelled: <reason>", and further down a
// chain "job C it waited for (--after) ended cancelled; the chain's first job P ended cancelled:
// <its reason>": the first job and its reason named once, however long the chain (issue 53: each
// reason nested the one before and was cut at 4 KiB, losing the cause).
std::string ChainedCancelReason(const std::string& parent, JobState outcome,
                                const std::string& reason);

class Jobs : private JobOwner {
 public:
  struct Options {
    std::string state_dir;  // jobs/<id>/ (logs, rendezvous) lives here
    Node node;
    std::string metrics_address;  // for GetNode
    Supervisor::Options supervisor;
    // Every path a spec names must resolve inside one of these (engine/core/path_policy.h); empty:
    // any path.
    std::vector<std::string> allowed_roots;
    // The most daemon time one submission's or plan's planning may take (ithacad
    // --max-plan-seconds): DEADLINE_EXCEEDED naming the job's length and model past it.
    absl::Duration max_plan_time = kMaxPlanTime;
  };

  Jobs(Options options, JobStore* store, Metrics* metrics);
  ~Jobs() override;
  Jobs(const Jobs&) = delete;
  Jobs& operator=(const Jobs&) = delete;

  // Recovers from a previous run (see above) and starts the supervisor.
  absl::Status Start();
  // Stops every running job (FAILED, `reason`) and waits for its workers. Queued jobs stay queued
  // for the next start. New submissions get UNAVAILABLE from now on.
  void Shutdown(const std::string& reason);
  // Stops serving and leaves running jobs running, for the next daemon on this state directory
  // to adopt (a restart, an upgrade). Returns how many were left.
  int Detach();
  // Before Detach (ithacad --drain-on-exit): asks every running job that can resume (a
  // checkpoint.dir, checkpoint.resume) to checkpoint and stop, and queues it again for the next
  // daemon; waits up to `timeout`. Stops admitting. Returns how many were drained.
  int Drain(absl::Duration timeout);
  // `ithaca drain` (JobService.Drain): pauses scheduling (jobs are admitted and queued, none
  // starts) and drains the running jobs that can resume, as Drain does, waiting up to `timeout`;
  // they are queued again. With `undo`, scheduling goes on and the queue starts. Both last until
  // the daemon restarts.
  // `cancelled` (the caller gone: its client cancelled the call) stops the waiting at once; what
  // was asked stays asked (scheduling paused, the jobs signalled).
  v1::DrainResponse DrainNode(bool undo, absl::Duration timeout,
                              std::function<bool()> cancelled = {});

  // JobService.
  // `cancelled` (the RPC's client went away) is polled while admitting (admission.h).
  absl::StatusOr<v1::Job> Submit(const v1::SubmitJobRequest& request,
                                 const std::function<bool()>& cancelled = nullptr);
  absl::StatusOr<v1::PlanJobResponse> Plan(const v1::PlanJobRequest& request,
                                           const std::function<bool()>& cancelled = nullptr);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // The job's persisted step and eval reports, oldest first (JobStore::History).
  absl::StatusOr<std::vector<v1::JobEvent>> History(const std::string& id);
  // One page (job.proto ListJobsRequest): at most kMaxListLimit jobs and about kMaxListBytes.
  static constexpr int kDefaultListLimit = 100;
  // The newest this many ended jobs keep their event streams in memory (a watcher whose
  // connection dropped resumes where it was); older ones are dropped (the store keeps their
  // state and history), so memory does not grow with every job.
  static constexpr size_t kEndedEventLogsKept = 16;
  static constexpr int kMaxListLimit = 1000;
  static constexpr size_t kMaxListBytes = 2 << 20;
  absl::StatusOr<v1::ListJobsResponse> List(const v1::ListJobsRequest& request);
  // INVALID_ARGUMENT for a reason longer than kMaxCancelReasonBytes (it is stored and sent back
  // with the job).
  static constexpr size_t kMaxCancelReasonBytes = 4096;
  absl::StatusOr<v1::Job> Cancel(const std::string& id, const std::string& reason);
  // Forgets an ended job: its rows in the store (record, transitions, step and eval history),
  // its event stream and its directory under the state directory (rank logs); never its
  // checkpoint.dir. Returns its last record. FAILED_PRECONDITION for a job that has not ended;
  // the id is never reused (JobStore::Delete).
  absl::StatusOr<v1::Job> Delete(const std::string& id);
  // The job's event stream; for a job that ended before this daemon started, a closed log
  // holding its final state change.
  absl::StatusOr<std::shared_ptr<EventLog>> Events(const std::string& id);
  v1::NodeInfo NodeInfo();
  void RefreshJobCounts();  // ithaca_jobs{state} from the store

  // The WorkerService talks to it.
  Supervisor* supervisor() { return &supervisor_; }

 private:
  static constexpr int kMaxConcurrentPlans = 4;
  // The nice value admission plans at (jobs.cc Admit), below the training ranks' and the
  // supervisor's.
  static constexpr int kPlanningNice = 10;
  // Submissions longer than this plan in at most kMaxConcurrentPlans - 1 slots.
  static constexpr int64_t kSmallPlanTokens = int64_t{1} << 20;
  // The request's overrides applied (engine/spec/overrides.h: the clients' --set), then
  // ParseSubmission (parse, validate, resolve with the planner) and, with `check_inputs`,
  // CheckInputs (the data and weights opened as the workers will), at most kMaxConcurrentPlans
  // at a time: RESOURCE_EXHAUSTED beyond. An error about a key names the line of the spec as
  // sent, or the override that set it.
  // `after`: the job the submission waits for (--after), which init.from = "job:ID" may name
  // before it has ended; "" for a plan, which takes a job's checkpoints as still to come.
  // `search`: a plan that says only whether the job fits (PlanJobRequest.fit_only), with what
  // earlier ones of the same job learned.
  template <typename Request>
  absl::StatusOr<AdmittedSpec> Admit(const Request& request, const Node& node, bool check_inputs,
                                     const std::function<bool()>& cancelled,
                                     const std::string& after, bool plan,
                                     const PlanLimits& search = {});
  // The FitMemo of a fit-only plan's job: the same spec, overrides (but data.seq_len) and
  // hardware share one; the newest kFitMemos are kept.
  std::shared_ptr<FitMemo> FitMemoFor(const v1::PlanJobRequest& request);
  static constexpr size_t kFitMemos = 16;
  Mutex fit_memos_mu_;
  std::list<std::pair<std::string, std::shared_ptr<FitMemo>>> fit_memos_
      ABSL_GUARDED_BY(fit_memos_mu_);  // newest first
  std::atomic<int> plans_in_flight_{0};

  // JobOwner: the supervisor's reports.
  std::vector<LaunchOrder> TakeLaunches() override;
  void OnLaunched(const std::string& job_id, const std::vector<int>& slots, int pgid,
                  const std::string& reason) override;
  void OnClusterJob(const std::string& job_id, const std::string& cluster_job) override;
  absl::StatusOr<v1::Job> OnStateChange(const std::string& job_id, JobState to,
                                        const std::string& reason) override;
  absl::Status OnStep(const std::string& job_id, const v1::StepReport& step) override;
  absl::Status OnEval(const std::string& job_id, const v1::EvalReport& eval) override;
  void OnLogLines(const std::string& job_id, int rank, std::vector<std::string> lines) override;
  void OnEnded(const std::string& job_id, JobState outcome, const std::string& reason,
               std::optional<int> failed_rank, bool retryable) override;
  // A failed job's [retry] policy: when it has restarts left, the job goes QUEUED again
  // ("restart N of M ...", resuming from its newest checkpoint) and joins the queue after its
  // backoff; true then.
  bool RestartLocked(const std::string& job_id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The jobs in `state` (RUNNING unless said) that can resume from a checkpoint (checkpoint.dir,
  // checkpoint.resume): the ones a drain stops. The others are added to `others`.
  std::vector<std::string> ResumableRunningLocked(std::vector<std::string>* others,
                                                  JobState state = v1::JOB_STATE_RUNNING)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Status Recover();
  // The newest checkpoint of a job whose spec asks to resume from one; "" when there is none.
  static std::string ResumableCheckpoint(const v1::Job& job);
  // For a job found STARTING or RUNNING at start whose workers still run (its adoption record
  // names live workers of the job): the order to adopt them, its slots reserved. nullopt
  // otherwise.
  // A Slurm job (Job.cluster_job "slurm:ID") is adoptable while Slurm still has it queued or
  // running; otherwise `why_not` says what Slurm says.
  std::optional<AdoptOrder> AdoptableLocked(const v1::Job& job, std::string* why_not)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr char kSlurmPrefix[] = "slurm:";
  // The scheduler's slots under Slurm: Slurm queues and places the jobs, not this daemon.
  static constexpr int kClusterSlots = 1 << 16;
  // Two live jobs never share a checkpoint.dir: one would delete the other's temporary save,
  // prune its steps, and a resume would load the other's state. FAILED_PRECONDITION naming the
  // job that uses `dir` (the admitted, absolute path; compared once resolved).
  absl::Status ClaimCheckpointDirLocked(const std::string& dir, const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseCheckpointDirLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `submit --after`: the job `parent` reached `outcome` (a terminal state). The jobs waiting
  // for it join the queue when it SUCCEEDED, and are cancelled (saying why, and so are theirs)
  // otherwise.
  void ResolveDependentsLocked(const std::string& parent, JobState outcome,
                               const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job ended: its stream is closed (see kEndedEventLogsKept).
  void EndEventsLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishState(const std::string& id, const v1::Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<EventLog> EventsLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  JobStore* const store_;
  Metrics* const metrics_;

  Mutex mu_;
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<EventLog>> events_ ABSL_GUARDED_BY(mu_);
  // Restarted jobs waiting out their backoff before they join the queue.
  struct BackingOff {
    absl::Time due;
    int world = 1;
  };
  std::map<std::string, BackingOff> backing_off_ ABSL_GUARDED_BY(mu_);
  // QUEUED jobs waiting for another to succeed (submit --after): job id → the job it waits for.
  // Not in the scheduler's queue until then; rebuilt from the store at start (Recover).
  std::map<std::string, std::string> waiting_ ABSL_GUARDED_BY(mu_);
  // resolved dir → live job id
  std::map<std::string, std::string> checkpoint_dirs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_events_ ABSL_GUARDED_BY(mu_);  // oldest first

  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool scheduling_paused_ ABSL_GUARDED_BY(mu_) = false;  // DrainNode: queued jobs wait for the undo
  // Last: its thread calls into the members above, so it is destroyed (and stopped) first.
  Supervisor supervisor_;
};

}  // namespace ithaca
